"""reservo on the lab network (tests/chaos/netns.py), for the partition scenarios.

Host ``db`` runs a PostgreSQL of the test's own (initdb in a temp dir, listening
on the host's lab address; PostgreSQL refuses root, so it runs as ``postgres``,
``nobody`` if there is none, as tests/ha.py does). Host ``app`` runs one reservo
API process and one ``worker --roles all``. Redis (a ``redis-server`` of the
test's own) and the job receiver listen on the lab gateway, in the machine's own
namespace: a fault between ``app`` and ``db`` touches neither. The test process
reaches every host directly, so its final SQL read never crosses a fault.

Where the kernel has no ``sch_netem`` the app reaches PostgreSQL through a delay
line in host ``db`` (port 6432, forwarding to 5432), idle until a scenario
slows the path.
"""

from __future__ import annotations

import contextlib
import os
import pwd
import signal
import socket
import subprocess
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

import httpx
import psutil

from reservo.core.embedded.postgres import pg_bin
from reservo.core.embedded.redis import _redis_server_bin
from tests.chaos import netns
from tests.chaos.stack import JWT_SECRET, PAY_SECRET, RESULTS_SECRET
from tests.helpers.procs import BIN, free_port

PG_PORT = 5432
LINE_PORT = 6432


def _pg_tool(name: str) -> str:
    system = Path("/usr/lib/postgresql/15/bin") / name
    return str(system) if system.exists() else pg_bin(name)


def _pg_user() -> pwd.struct_passwd:
    for name in ("postgres", "nobody"):
        with contextlib.suppress(KeyError):
            return pwd.getpwnam(name)
    raise RuntimeError("neither user postgres nor nobody exists")


def _wait_port(address: str, port: int, timeout_s: float, what: str) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        with contextlib.suppress(OSError), socket.create_connection((address, port), 0.5):
            return
        time.sleep(0.05)
    raise TimeoutError(f"{what} not listening on {address}:{port}")


def _stop(proc: subprocess.Popen[bytes] | None, sig: signal.Signals = signal.SIGTERM) -> None:
    if proc is None or proc.poll() is not None:
        return
    proc.send_signal(sig)
    try:
        proc.wait(15)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()


@dataclass
class LabPostgres:
    """A PostgreSQL in lab host ``host``, as an unprivileged user (fsync off: a
    throwaway cluster)."""

    net: netns.Lab
    host: str
    root: Path
    proc: subprocess.Popen[bytes] | None = None

    @property
    def address(self) -> str:
        return self.net.hosts[self.host].address

    def url(self, port: int = PG_PORT) -> str:
        return f"postgresql://postgres@{self.address}:{port}/reservo"

    def start(self) -> None:
        user = _pg_user()
        data = self.root / "pgdata"
        self.root.chmod(0o755)
        data.mkdir(mode=0o700)
        os.chown(data, user.pw_uid, user.pw_gid)
        subprocess.run(
            [_pg_tool("initdb"), "-D", str(data), "-U", "postgres", "--auth=trust",
             "--encoding=UTF8", "--locale=C", "--no-instructions", "--no-sync"],
            user=user.pw_uid, group=user.pw_gid, extra_groups=[], check=True,
            capture_output=True, timeout=120,
        )  # fmt: skip
        with (data / "pg_hba.conf").open("a") as hba:
            hba.write(f"host all all {self.net.subnet} trust\n")
        log = (self.root / "postgres.log").open("ab")
        # setpriv execs PostgreSQL itself (no parent left to relay signals), as the user.
        self.proc = subprocess.Popen(
            self.net.command(self.host, [
                "setpriv", f"--reuid={user.pw_uid}", f"--regid={user.pw_gid}", "--clear-groups",
                _pg_tool("postgres"), "-D", str(data), "-p", str(PG_PORT),
                "-c", f"listen_addresses={self.address},127.0.0.1",
                "-c", f"unix_socket_directories={data}", "-c", "fsync=off",
                "-c", "synchronous_commit=off", "-c", "full_page_writes=off",
                "-c", "max_connections=60",
            ]),
            stdout=log, stderr=subprocess.STDOUT,
        )  # fmt: skip
        _wait_port(self.address, PG_PORT, 30, "PostgreSQL")
        deadline = time.monotonic() + 30
        while True:
            made = subprocess.run(
                [_pg_tool("psql"), "-h", self.address, "-U", "postgres", "-d", "postgres",
                 "-Atc", "CREATE DATABASE reservo"],
                capture_output=True, text=True, timeout=30,
            )  # fmt: skip
            if made.returncode == 0:
                return
            if time.monotonic() > deadline:
                raise RuntimeError(f"CREATE DATABASE failed: {made.stderr}")
            time.sleep(0.2)  # still starting up

    def stop(self) -> None:
        _stop(self.proc, signal.SIGINT)  # fast shutdown


@dataclass
class LabReservo:
    """reservo's API and one worker in lab host ``app``."""

    net: netns.Lab
    host: str
    database_url: str
    redis_url: str
    receiver: str  # the job receiver's address (RESERVO_JOBS_HTTP_ALLOW)
    logs: Path
    extra_env: dict[str, str] = field(default_factory=dict)
    port: int = 8000
    api: subprocess.Popen[bytes] | None = None
    worker: subprocess.Popen[bytes] | None = None

    @property
    def address(self) -> str:
        return self.net.hosts[self.host].address

    @property
    def url(self) -> str:
        return f"http://{self.address}:{self.port}"

    def env(self) -> dict[str, str]:
        return {
            **os.environ,
            "RESERVO_DATABASE_URL": self.database_url,
            "RESERVO_REDIS_URL": self.redis_url,
            "RESERVO_REDIS_NAMESPACE": "partition",
            "RESERVO_JWT_SECRET": JWT_SECRET,
            "RESERVO_PAYMENTS_WEBHOOK_SECRET": PAY_SECRET,
            "RESERVO_RESULTS_WEBHOOK_SECRET": RESULTS_SECRET,
            "RESERVO_LOG_LEVEL": "WARNING",
            "RESERVO_LOG_JSON": "true",
            "RESERVO_HTTP_HOST": self.address,
            "RESERVO_JOBS_HTTP_ALLOW": self.receiver,
            "RESERVO_OUTBOX_POLL_INTERVAL_S": "0.1",
            "RESERVO_OUTBOX_BACKOFF_MAX_S": "2",
            "RESERVO_IDEMPOTENCY_LEASE_S": "6",
            "RESERVO_SCHEDULER_BACKOFF_MAX_S": "2",
            "RESERVO_SCHEDULER_REAPER_TIMEOUT_S": "6",
            **self.extra_env,
        }

    def migrate(self) -> None:
        subprocess.run(
            [str(BIN), "db", "migrate"], env=self.env(), check=True, capture_output=True,
            timeout=120,
        )  # fmt: skip

    def _spawn(self, name: str, args: list[str]) -> subprocess.Popen[bytes]:
        with (self.logs / f"{name}.log").open("ab") as out:
            return subprocess.Popen(
                self.net.command(self.host, [str(BIN), *args]),
                env=self.env(), stdout=out, stderr=subprocess.STDOUT,
            )  # fmt: skip

    def start(self) -> None:
        self.api = self._spawn("api", ["api", "--port", str(self.port)])
        self.worker = self._spawn("worker", ["worker", "--roles", "all"])
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            for proc in (self.api, self.worker):
                if proc.poll() is not None:
                    raise RuntimeError(f"exited {proc.returncode}: {self.tail()}")
            with contextlib.suppress(httpx.HTTPError):
                if httpx.get(f"{self.url}/healthz", timeout=1).is_success:
                    return
            time.sleep(0.2)
        raise TimeoutError(f"the API is not ready: {self.tail()}")

    def rss_bytes(self) -> int:
        """The API process's resident memory (``ip netns exec`` execs it: same pid)."""
        assert self.api is not None
        return int(psutil.Process(self.api.pid).memory_info().rss)

    def stop(self) -> None:
        for proc in (self.api, self.worker):
            _stop(proc)

    def tail(self, name: str = "api", chars: int = 3000) -> str:
        with contextlib.suppress(OSError):
            return (self.logs / f"{name}.log").read_text(errors="replace")[-chars:]
        return "(no log)"


@dataclass
class LabRedis:
    address: str
    port: int = field(default_factory=free_port)
    proc: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"redis://{self.address}:{self.port}/0"

    def start(self) -> None:
        self.proc = subprocess.Popen(
            [_redis_server_bin(), "--bind", self.address, "--port", str(self.port), "--save", "",
             "--appendonly", "no", "--protected-mode", "no"],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
        )  # fmt: skip
        _wait_port(self.address, self.port, 10, "Redis")

    def stop(self) -> None:
        _stop(self.proc)


def temp_root() -> Path:
    return Path(tempfile.mkdtemp(prefix="reservo-partition-"))
