"""What the embedded servers share: their directory lock, port bookkeeping and
port-retry loop, start/stop sequence, process helpers, and the child-process
server (Redis, the Kafka broker)."""

from __future__ import annotations

import atexit
import contextlib
import fcntl
import importlib.util
import os
import signal
import socket
import subprocess
import time
from collections.abc import Callable
from pathlib import Path
from types import TracebackType
from typing import Self

import psutil
import structlog

log = structlog.get_logger(__name__)

HOST = "127.0.0.1"
START_TIMEOUT_S = 30
STOP_TIMEOUT_S = 30
# Attempts with a fresh port when another process grabs the chosen one first.
PORT_ATTEMPTS = 3


class EmbeddedError(RuntimeError):
    """An embedded server could not be started or stopped."""


def package_dir(name: str) -> Path:
    """Directory of an installed package, found without importing it (no side effects)."""
    spec = importlib.util.find_spec(name)
    if spec is None or not spec.submodule_search_locations:
        raise EmbeddedError(f"package {name!r} is not installed")
    return Path(next(iter(spec.submodule_search_locations)))


def _port_is_free(port: int) -> bool:
    """Whether we can bind the port; SO_REUSEADDR like the servers, so TIME_WAIT is no obstacle."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind((HOST, port))
        except OSError:
            return False
    return True


def _any_free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind((HOST, 0))
        port: int = sock.getsockname()[1]
    return port


def read_int(path: Path) -> int | None:
    try:
        return int(path.read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return None


def tail(path: Path, lines: int = 20) -> str:
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
    except OSError:
        return "(no log)"


def ms_since(since: float) -> int:
    return round((time.monotonic() - since) * 1000)


def process_in_dir(pid: int, directory: Path, name: str) -> psutil.Process | None:
    """The live process ``pid`` if it is a ``name`` server working in ``directory``.

    Servers chdir into their data directory, so the cwd tells an orphan from a
    recycled pid; the command line is the fallback when cwd is not readable.
    """
    try:
        proc = psutil.Process(pid)
        if proc.status() == psutil.STATUS_ZOMBIE or name not in proc.name():
            return None
        try:
            if Path(proc.cwd()) == directory:
                return proc
        except psutil.AccessDenied:
            pass
        return proc if str(directory) in " ".join(proc.cmdline()) else None
    except (psutil.NoSuchProcess, psutil.AccessDenied):
        return None


def wait_gone(proc: psutil.Process, timeout_s: float) -> bool:
    """Wait until the process has exited; True if it did within ``timeout_s``.

    A daemonized postmaster is not our child: once it exits it is a zombie until
    init reaps it (which can take seconds in a container), so a zombie counts as gone.
    """
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            if proc.status() == psutil.STATUS_ZOMBIE:
                return True
        except psutil.NoSuchProcess:
            return True
        if time.monotonic() >= deadline:
            return False
        time.sleep(0.01)


def kill(proc: psutil.Process, first: signal.Signals, timeout_s: float) -> None:
    """Send ``first``, then SIGKILL if the process outlives ``timeout_s``."""
    with contextlib.suppress(psutil.NoSuchProcess):
        proc.send_signal(first)
        if not wait_gone(proc, timeout_s):
            proc.kill()
            wait_gone(proc, 5)


class Embedded:
    """Port bookkeeping, the start/stop sequence, atexit safety net and
    context-manager protocol shared by every embedded server."""

    kind = "embedded"
    log_file: Path

    def __init__(self, root: Path, port: int | None) -> None:
        self.root = root
        self._requested_port = port
        self._port_file = root / "port"
        self._url: str | None = None
        self._lock_fd: int | None = None
        self.port: int | None = None
        # Duration of the last successful start(), in seconds.
        self.startup_s: float | None = None

    @property
    def url(self) -> str:
        """Connection URL of the running server."""
        if self._url is None:
            raise EmbeddedError(f"{self.kind} is not started")
        return self._url

    def _candidate_ports(self) -> list[int | None]:
        """Ports to try: the requested one only, else the recorded one (if free) then fresh ones."""
        if self._requested_port is not None:
            return [self._requested_port]
        recorded = read_int(self._port_file)
        first = recorded if recorded is not None and _port_is_free(recorded) else None
        return [first, *[None] * (PORT_ATTEMPTS - 1)]

    def _lock(self) -> None:
        """Hold an exclusive lock on ``root/lock`` while we run the server.

        It tells a live owner (refuse to start) from a crashed one (the kernel
        dropped its lock, so a server still running is an orphan we may stop).
        """
        if self._lock_fd is not None:
            return
        self.root.mkdir(parents=True, exist_ok=True)
        fd = os.open(self.root / "lock", os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(fd)
            raise EmbeddedError(f"{self.root} is in use by another process") from None
        self._lock_fd = fd

    def _may_stop(self) -> bool:
        """Whether this handle may stop the server: not while another live process owns it."""
        if not self.root.exists():
            return False  # never started here: nothing to stop
        try:
            self._lock()
        except EmbeddedError:
            log.warning(f"{self.kind}.stop_skipped_owned_elsewhere", root=str(self.root))
            return False
        return True

    def _unlock(self) -> None:
        if self._lock_fd is not None:
            os.close(self._lock_fd)
            self._lock_fd = None

    def _started(self, port: int, url: str, t0: float, **timings: int) -> str:
        self._port_file.write_text(f"{port}\n")
        self.port = port
        self._url = url
        self.startup_s = time.monotonic() - t0
        # Safety net for a plain interpreter exit; SIGKILL leaves an orphan that
        # the next start() detects and stops.
        atexit.register(self.stop)
        log.info(f"{self.kind}.started", url=url, total_ms=ms_since(t0), **timings)
        return url

    def _stopped(self) -> None:
        atexit.unregister(self.stop)
        self._url = None
        self._unlock()

    def start(self) -> str:
        """Start the server (once) and return its URL, holding the directory lock
        while it runs."""
        if self._url is not None and self._running():
            return self._url
        t0 = time.monotonic()
        self._lock()
        try:
            return self._start(t0)
        except BaseException:
            self._unlock()
            raise

    def _on_a_port(self, start_on: Callable[[int], None]) -> int:
        """Run ``start_on`` on each candidate port until one works; returns that
        port. Another process may take a port we found free before the server
        binds it: ``start_on`` then cleans up and raises EmbeddedError, and the
        next candidate is tried."""
        last_error: EmbeddedError | None = None
        for candidate in self._candidate_ports():
            port = candidate if candidate is not None else _any_free_port()
            try:
                start_on(port)
                return port
            except EmbeddedError as err:
                log.warning(
                    f"{self.kind}.start_failed", port=port, error=str(err), log=tail(self.log_file)
                )
                last_error = err
        assert last_error is not None
        raise last_error

    def stop(self) -> None:
        """Stop the server if it runs; a no-op otherwise (safe to call twice)."""
        if not self._may_stop():
            return
        if self._may_be_running():
            t0 = time.monotonic()
            self._shut_down()
            log.info(f"{self.kind}.stopped", stop_ms=ms_since(t0))
        self._stopped()

    # -- what each server provides ----------------------------------------------------

    def _running(self) -> bool:
        """Whether the server this handle started still runs."""
        raise NotImplementedError

    def _start(self, t0: float) -> str:
        """Start it (the lock is held) and return ``self._started(...)``."""
        raise NotImplementedError

    def _may_be_running(self) -> bool:
        """Whether a server (ours, or an orphan of a crashed run) may need stopping."""
        raise NotImplementedError

    def _shut_down(self) -> None:
        raise NotImplementedError

    def __enter__(self) -> Self:
        self.start()
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()


class ChildServer(Embedded):
    """A server run as our own child process, in a new session (so a terminal
    Ctrl-C reaches us first and we shut it down in order), with a pid file that
    finds it again after a crash of ours."""

    # The server's program name, in errors and to recognise an orphan.
    binary_name: str
    # How long it may take to exit after SIGTERM before it is killed.
    terminate_timeout_s: float = STOP_TIMEOUT_S

    def __init__(self, root: Path, port: int | None, *, log_name: str, pid_name: str) -> None:
        super().__init__(root, port)
        self.log_file = self.root / log_name
        self._pid_file = self.root / pid_name
        self._proc: subprocess.Popen[bytes] | None = None

    def _orphan(self, pid: int) -> psutil.Process | None:
        """The process ``pid`` if it is this server left by a crashed run."""
        raise NotImplementedError

    def _ready(self, proc: subprocess.Popen[bytes], port: int) -> bool:
        """Whether the child answers on ``port`` (and not another process)."""
        raise NotImplementedError

    def _server(self) -> psutil.Process | None:
        """Our server, or an orphan one from a crashed run (per its pid file)."""
        if self._proc is not None and self._proc.poll() is None:
            with contextlib.suppress(psutil.NoSuchProcess):
                return psutil.Process(self._proc.pid)
        pid = read_int(self._pid_file)
        return None if pid is None else self._orphan(pid)

    def _running(self) -> bool:
        return self._server() is not None

    def _may_be_running(self) -> bool:
        return self._proc is not None or self._pid_file.exists()

    def _clear_leftovers(self) -> None:
        """Stop the orphan of a crashed run and forget its pid file."""
        if self._pid_file.exists():
            orphan = self._server()
            log.warning(f"{self.kind}.leftover", pid=read_int(self._pid_file), alive=bool(orphan))
            if orphan is not None:
                kill(orphan, signal.SIGTERM, self.terminate_timeout_s)
            self._pid_file.unlink(missing_ok=True)

    def _await_ready(self, proc: subprocess.Popen[bytes], port: int) -> None:
        """Return once the child is ready on ``port``; raise EmbeddedError (the
        child stopped) when it exits first or is not ready in time."""
        self._proc = proc
        name = self.binary_name
        deadline = time.monotonic() + START_TIMEOUT_S
        while time.monotonic() < deadline:
            if proc.poll() is not None:
                self._proc = None
                raise EmbeddedError(
                    f"{name} exited ({proc.returncode}) on port {port}: {tail(self.log_file, 5)}"
                )
            if self._ready(proc, port):
                return
            time.sleep(0.01)
        self._shut_down()
        raise EmbeddedError(f"{name} was not ready on port {port}")

    def _shut_down(self) -> None:
        server = self._server()
        if server is not None:
            kill(server, signal.SIGTERM, self.terminate_timeout_s)
        if self._proc is not None:
            self._proc.wait()  # reap: no zombie
            self._proc = None
        self._pid_file.unlink(missing_ok=True)
