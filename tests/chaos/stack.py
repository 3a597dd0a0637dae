"""The chaos suite's own world: a PostgreSQL cluster, a Redis and a Tansu Kafka
broker it may restart, flush and freeze, and reservo's real processes (API and
``worker --roles all``) configured only through environment variables."""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import time
from dataclasses import dataclass, field
from pathlib import Path

import httpx

from reservo.core.embedded import EmbeddedKafka, EmbeddedPostgres, EmbeddedRedis
from tests.chaos.fakes import HttpRecorder, SmtpRecorder
from tests.helpers.procs import BIN, free_port

JWT_SECRET = "chaos-jwt-secret-0123456789abcdef-chaos"
PAY_SECRET = "chaos-payments-webhook-secret-0123456789"
RESULTS_SECRET = "chaos-results-webhook-secret-0123456789"


def _redis_command(port: int, *words: str) -> bytes:
    """One RESP command on a fresh connection (no client library state to reset)."""
    parts = [f"*{len(words)}\r\n".encode()]
    for w in words:
        parts.append(f"${len(w.encode())}\r\n{w}\r\n".encode())
    with socket.create_connection(("127.0.0.1", port), timeout=5) as sock:
        sock.sendall(b"".join(parts))
        return sock.recv(256)


@dataclass
class Infra:
    """PostgreSQL, Redis and Kafka on fixed loopback ports, so a restart comes back
    at the same address the reservo processes were configured with."""

    root: Path
    pg: EmbeddedPostgres = field(init=False)
    redis: EmbeddedRedis = field(init=False)
    kafka: EmbeddedKafka = field(init=False)
    database_url: str = ""
    redis_url: str = ""
    bootstrap: str = ""

    def __post_init__(self) -> None:
        self.pg = EmbeddedPostgres(self.root, port=free_port())
        self.redis = EmbeddedRedis(self.root, port=free_port())
        self.kafka = EmbeddedKafka(self.root, port=free_port())

    def start(self) -> None:
        self.database_url = self.pg.start()
        self.redis_url = self.redis.start()
        self.bootstrap = self.kafka.start()

    def stop(self) -> None:
        self.kafka_resume()  # a frozen broker ignores SIGTERM until it runs again
        for server in (self.kafka, self.redis, self.pg):
            with contextlib.suppress(Exception):
                server.stop()

    # -- faults ----------------------------------------------------------------------
    def pg_stop(self) -> None:
        self.pg.stop()

    def pg_start(self) -> None:
        self.pg.start()

    def redis_flush_and_stop(self) -> None:
        assert self.redis.port is not None
        assert _redis_command(self.redis.port, "FLUSHALL").startswith(b"+OK")
        self.redis.stop()

    def redis_start(self) -> None:
        self.redis.start()

    def _kafka_pid(self) -> int:
        proc = self.kafka._server()
        assert proc is not None, "the broker is not running"
        return int(proc.pid)

    def kafka_freeze(self) -> None:
        os.kill(self._kafka_pid(), signal.SIGSTOP)

    def kafka_resume(self) -> None:
        with contextlib.suppress(AssertionError, ProcessLookupError):
            os.kill(self._kafka_pid(), signal.SIGCONT)


@dataclass
class Proc:
    name: str
    args: list[str]
    log: Path
    port: int | None = None
    popen: subprocess.Popen[bytes] | None = None
    starts: int = 0
    kills: int = 0
    # This process's own settings over Reservo.env (e.g. a database URL that
    # reaches PostgreSQL from another place in a network lab).
    env: dict[str, str] = field(default_factory=dict)


SLOW_CLIENT_TIMEOUT_S = 5.0


class Reservo:
    """Two API processes and two ``worker --roles all`` processes."""

    def __init__(self, infra: Infra, smtp: SmtpRecorder, gateway: HttpRecorder, logs: Path):
        self.infra = infra
        self.logs = logs
        self.env = {
            **os.environ,
            "RESERVO_DATABASE_URL": infra.database_url,
            "RESERVO_REDIS_URL": infra.redis_url,
            "RESERVO_REDIS_NAMESPACE": "chaos",
            "RESERVO_JWT_SECRET": JWT_SECRET,
            "RESERVO_PAYMENTS_WEBHOOK_SECRET": PAY_SECRET,
            "RESERVO_RESULTS_WEBHOOK_SECRET": RESULTS_SECRET,
            "RESERVO_LOG_LEVEL": "WARNING",
            "RESERVO_LOG_JSON": "true",
            "RESERVO_DB_POOL_MIN": "1",
            "RESERVO_DB_POOL_MAX": "8",
            "RESERVO_DB_ACQUIRE_TIMEOUT_S": "3",
            # Slow clients are cut after 5 s (the default 15 s, scaled down).
            "RESERVO_HTTP_HEADER_TIMEOUT_S": str(SLOW_CLIENT_TIMEOUT_S),
            "RESERVO_HTTP_BODY_TIMEOUT_S": str(SLOW_CLIENT_TIMEOUT_S),
            # Kafka: Tansu's memory store refuses InitProducerId.
            "RESERVO_KAFKA_BOOTSTRAP": infra.bootstrap,
            "RESERVO_KAFKA_IDEMPOTENCE": "false",
            "RESERVO_KAFKA_PARTITIONS": "2",
            "RESERVO_KAFKA_SESSION_TIMEOUT_MS": "6000",
            "RESERVO_KAFKA_REQUEST_TIMEOUT_MS": "5000",
            "RESERVO_KAFKA_CONSUMER_BACKOFF_MAX_S": "1",
            # The outside world.
            "RESERVO_NOTIFY_CHANNEL": "smtp",
            "RESERVO_NOTIFY_SMTP_HOST": "127.0.0.1",
            "RESERVO_NOTIFY_SMTP_PORT": str(smtp.port),
            "RESERVO_NOTIFY_TIMEOUT_S": "3",
            "RESERVO_RENTALS_PAYMENT_GATEWAY": "http",
            "RESERVO_RENTALS_GATEWAY_URL": f"http://127.0.0.1:{gateway.port}",
            "RESERVO_RENTALS_GATEWAY_TIMEOUT_S": "3",
            "RESERVO_JOBS_HTTP_ALLOW": "127.0.0.1",
            "RESERVO_SCHEDULER_HTTP_TIMEOUT_S": "3",
            # A trickling destination is cut after 3 s, at most 4 calls to it per
            # worker process (the trickling scenario).
            "RESERVO_SCHEDULER_HTTP_DEADLINE_S": "3",
            "RESERVO_SCHEDULER_HTTP_PER_DESTINATION": "4",
            # Quick recovery: short caps and leases (every one is a documented setting).
            "RESERVO_OUTBOX_POLL_INTERVAL_S": "0.1",
            "RESERVO_OUTBOX_BACKOFF_MAX_S": "2",
            "RESERVO_OUTBOX_LEASE_S": "6",
            "RESERVO_IDEMPOTENCY_LEASE_S": "6",
            "RESERVO_SCHEDULER_BACKOFF_MAX_S": "2",
            "RESERVO_SCHEDULER_REAPER_TIMEOUT_S": "6",
            "RESERVO_SCHEDULER_RESYNC_PERIOD_S": "10",
            "RESERVO_BETTING_RESEND_LEASE_S": "6",
            "RESERVO_BETTING_BREAKER_RESET_S": "3",
            "RESERVO_BETTING_SWEEP_INTERVAL_S": "2",
        }
        self.procs: dict[str, Proc] = {}
        for i in (1, 2):
            port = free_port()
            self.procs[f"api{i}"] = Proc(
                f"api{i}", ["api", "--port", str(port)], logs / f"api{i}.log", port=port
            )
        for i in (1, 2):
            self.procs[f"worker{i}"] = Proc(
                f"worker{i}", ["worker", "--roles", "all"], logs / f"worker{i}.log"
            )

    @property
    def api_urls(self) -> list[str]:
        return [f"http://127.0.0.1:{p.port}" for p in self.procs.values() if p.port]

    def migrate(self) -> None:
        subprocess.run(
            [str(BIN), "db", "migrate"], env=self.env, check=True, capture_output=True, timeout=120
        )

    def start(self, name: str) -> None:
        proc = self.procs[name]
        with proc.log.open("ab") as out:
            proc.popen = subprocess.Popen(
                [str(BIN), *proc.args],
                env={**self.env, **proc.env},
                stdout=out,
                stderr=subprocess.STDOUT,
            )
        proc.starts += 1

    def wait_ready(self, name: str, timeout_s: float = 60) -> None:
        """An API is ready when /healthz answers; a worker when it is running."""
        proc = self.procs[name]
        assert proc.popen is not None
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if proc.popen.poll() is not None:
                raise RuntimeError(f"{name} exited {proc.popen.returncode}: {self.tail(name)}")
            if proc.port is None:
                return
            try:
                if httpx.get(f"http://127.0.0.1:{proc.port}/healthz", timeout=1).is_success:
                    return
            except httpx.HTTPError:
                pass
            time.sleep(0.2)
        raise TimeoutError(f"{name} not ready: {self.tail(name)}")

    def start_all(self) -> None:
        for name in self.procs:
            self.start(name)
        for name in self.procs:
            self.wait_ready(name)

    def kill(self, name: str) -> None:
        proc = self.procs[name]
        assert proc.popen is not None
        proc.popen.send_signal(signal.SIGKILL)
        proc.popen.wait(10)
        proc.kills += 1

    def pids(self) -> dict[str, int]:
        return {n: p.popen.pid for n, p in self.procs.items() if p.popen is not None}

    def alive(self) -> dict[str, bool]:
        return {n: p.popen is not None and p.popen.poll() is None for n, p in self.procs.items()}

    def stop_all(self) -> None:
        for proc in self.procs.values():
            if proc.popen is not None and proc.popen.poll() is None:
                proc.popen.terminate()
        for proc in self.procs.values():
            if proc.popen is not None:
                try:
                    proc.popen.wait(15)
                except subprocess.TimeoutExpired:
                    proc.popen.kill()
                    proc.popen.wait()

    def tail(self, name: str, chars: int = 3000) -> str:
        try:
            return self.procs[name].log.read_text(errors="replace")[-chars:]
        except OSError:
            return "(no log)"

    def log_lines(self, needle: str) -> list[str]:
        """Log lines of every process containing ``needle``."""
        found: list[str] = []
        for proc in self.procs.values():
            with contextlib.suppress(OSError):
                found += [
                    f"{proc.name}: {line}"
                    for line in proc.log.read_text(errors="replace").splitlines()
                    if needle in line
                ]
        return found
