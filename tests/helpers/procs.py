"""Run reservo's real entry points as subprocesses for process-level tests."""

from __future__ import annotations

import os
import random
import socket
import subprocess
import sys
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path

import httpx

from reservo.settings import Settings

BIN = Path(sys.executable).parent / "reservo"


# Ports handed out by this process: two callers never get the same one before
# either binds it.
_handed: set[int] = set()


def _ephemeral_low() -> int:
    """The first port the kernel gives outgoing connections (and ``bind(0)``);
    Linux's default when unreadable."""
    try:
        return int(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return 32768


def _bindable(port: int) -> bool:
    with socket.socket() as s:
        try:
            s.bind(("127.0.0.1", port))
        except OSError:
            return False
        return True


def free_port(plus: int = 0) -> int:
    """A free port for a server a test starts, with ``port + plus`` free too (a
    Redis Cluster node's bus port is its port + 10000).

    Taken below the kernel's ephemeral range where it leaves room: a port free
    when chosen but inside that range can be taken by any outgoing connection
    before the server binds it (a CI run lost a Redis Cluster bus port that way)."""
    first, last = 10000, _ephemeral_low() - 1 - plus
    if last - first < 1000:  # no room below it: anywhere, with the old risk
        first, last = 1024, 65535 - plus
    for _ in range(10_000):
        port = random.randint(first, last)
        wanted = {port, port + plus}
        if not wanted & _handed and all(_bindable(p) for p in wanted):
            _handed.update(wanted)
            return port
    raise RuntimeError(f"no free port in {first}-{last}")


def env_for(settings: Settings, **extra: str) -> dict[str, str]:
    env = dict(os.environ)
    env.update(
        {
            "RESERVO_DATABASE_URL": settings.database_url or "",
            "RESERVO_REDIS_URL": settings.redis_url or "",
            "RESERVO_JWT_SECRET": settings.jwt_secret,
            "RESERVO_REDIS_NAMESPACE": settings.redis_namespace,
            "RESERVO_PAYMENTS_WEBHOOK_SECRET": settings.payments_webhook_secret,
            "RESERVO_RESULTS_WEBHOOK_SECRET": settings.results_webhook_secret,
            "RESERVO_LOG_LEVEL": "WARNING",
            # Stop at once on SIGTERM: tests end many servers, and nothing balances
            # them (the drain has its own test, tests/e2e/test_graceful_stop.py).
            "RESERVO_HTTP_DRAIN_S": "0",
        }
    )
    if settings.rentals.payment_gateway is not None:
        env["RESERVO_RENTALS_PAYMENT_GATEWAY"] = settings.rentals.payment_gateway
    env.update(extra)
    return env


@contextmanager
def running(
    args: Sequence[str], env: dict[str, str], log: Path
) -> Iterator[subprocess.Popen[bytes]]:
    with log.open("wb") as out:
        proc = subprocess.Popen([str(BIN), *args], env=env, stdout=out, stderr=subprocess.STDOUT)
        try:
            yield proc
        finally:
            if proc.poll() is None:
                proc.terminate()
                try:
                    proc.wait(15)
                except subprocess.TimeoutExpired:
                    proc.kill()
                    proc.wait()


def wait_http(url: str, proc: subprocess.Popen[bytes], log: Path, timeout_s: float = 30) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"process exited with {proc.returncode}:\n{log.read_text()}")
        try:
            if httpx.get(url, timeout=1).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        time.sleep(0.2)
    raise TimeoutError(f"{url} not ready:\n{log.read_text()}")
