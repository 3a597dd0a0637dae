"""A primary and a hot standby streaming from it: real replication, real replay lag.

Both run from the embedded PostgreSQL binaries (``reservo.core.embedded``, which
also runs them as an unprivileged user when we are root). The standby is a
``pg_basebackup -R`` copy of the migrated primary, started on its own port; it
can be paused (``pg_wal_replay_pause``), killed (SIGKILL to every one of its
processes, like a machine that dies) and started again on the same port.
"""

from __future__ import annotations

import asyncio
import os
import pwd
import shutil
import signal
import stat
import subprocess
import tempfile
import time
import uuid
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import asyncpg
import httpx
import psutil
import pytest
from prometheus_client import REGISTRY

from reservo.app import create_app
from reservo.bootstrap import Container, build
from reservo.core.db.migrate import migrate
from reservo.core.embedded import EmbeddedError, EmbeddedPostgres
from reservo.core.embedded.postgres import DEFAULT_PG_RUN_AS, pg_bin
from reservo.core.kernel.clock import OffsetClock
from reservo.settings import Settings

LSN_SQL = "SELECT pg_current_wal_lsn() - '0/0'::pg_lsn"
REPLAYED_SQL = "SELECT pg_last_wal_replay_lsn() - '0/0'::pg_lsn"


def missing_binaries() -> str | None:
    """Why a pair cannot run here, or None."""
    try:
        tools = [pg_bin(name) for name in ("initdb", "pg_ctl", "pg_basebackup", "postgres")]
    except EmbeddedError as exc:
        return str(exc)
    absent = [t for t in tools if not Path(t).exists()]
    return f"PostgreSQL binaries missing: {', '.join(absent)}" if absent else None


def _server_user() -> pwd.struct_passwd | None:
    """PostgreSQL refuses root: then the servers run as EmbeddedPostgres's default user."""
    return pwd.getpwnam(DEFAULT_PG_RUN_AS) if os.geteuid() == 0 else None


def _alive(proc: psutil.Process) -> bool:
    """A daemonized postmaster is not our child: dead, it stays a zombie until
    init reaps it."""
    try:
        return bool(proc.status() != psutil.STATUS_ZOMBIE)
    except psutil.NoSuchProcess:
        return False


class HotStandbyPair:
    def __init__(self, root: Path) -> None:
        self.primary = EmbeddedPostgres(root / "primary")
        self.standby = EmbeddedPostgres(root / "standby")
        self.primary_url = ""
        self.standby_url = ""

    async def start(self) -> None:
        await asyncio.to_thread(self._initdb)
        self.primary_url = await asyncio.to_thread(self.primary.start)
        await migrate(self.primary_url)
        await asyncio.to_thread(self._base_backup)
        self.standby_url = await asyncio.to_thread(self.standby.start)
        await self.caught_up()

    # Both clusters are throwaway: no fsync anywhere (initdb, the base backup, the
    # servers, the standby's crash restart), which takes seconds off every step.

    def _initdb(self) -> None:
        target = self.primary.pgdata
        self._own(target.parent)
        # fmt: off
        self._as_server_user([
            pg_bin("initdb"), "-D", str(target), "-U", "postgres", "--auth=trust",
            "--encoding=UTF8", "--locale=C", "--no-instructions", "--no-sync",
        ])
        # fmt: on
        with (target / "postgresql.conf").open("a") as conf:
            conf.write("fsync = off\nfull_page_writes = off\n")

    def _base_backup(self) -> None:
        target = self.standby.pgdata
        self._own(target.parent)
        # fmt: off
        self._as_server_user([
            pg_bin("pg_basebackup"), "-h", "127.0.0.1", "-p", str(self.primary.port),
            "-U", "postgres", "-D", str(target), "-R", "-X", "stream", "-c", "fast",
            "--no-sync",
        ])
        # fmt: on

    def _own(self, directory: Path) -> None:
        """Make ``directory``, reachable and owned by the user the servers run as."""
        directory.mkdir(parents=True)
        for d in [directory, *directory.parents]:
            if d == Path(tempfile.gettempdir()):
                break
            d.chmod(d.stat().st_mode | stat.S_IXOTH)
        if (user := _server_user()) is not None:
            os.chown(directory, user.pw_uid, user.pw_gid)

    def _as_server_user(self, args: list[str]) -> None:
        user = _server_user()
        as_user = {} if user is None else {"user": user.pw_uid, "group": user.pw_gid}
        subprocess.run(
            args, check=True, capture_output=True, timeout=120, extra_groups=[], **as_user
        )

    def stop(self) -> None:
        self.standby.stop()
        self.primary.stop()

    # -- what the tests do to the standby ----------------------------------------

    async def caught_up(self, timeout_s: float = 15.0) -> None:
        """Until the standby has replayed everything the primary wrote so far."""
        primary = await asyncpg.connect(self.primary_url)
        standby = await asyncpg.connect(self.standby_url)
        try:
            target = await primary.fetchval(LSN_SQL)
            deadline = time.monotonic() + timeout_s
            while (await standby.fetchval(REPLAYED_SQL) or 0) < target:
                assert time.monotonic() < deadline, "the standby did not catch up"
                await asyncio.sleep(0.02)
        finally:
            await primary.close()
            await standby.close()

    async def _on_standby(self, sql: str) -> None:
        conn = await asyncpg.connect(self.standby_url)
        try:
            await conn.execute(sql)
        finally:
            await conn.close()

    async def pause_replay(self) -> None:
        await self._on_standby("SELECT pg_wal_replay_pause()")

    async def resume_replay(self) -> None:
        await self._on_standby("SELECT pg_wal_replay_resume()")

    def kill_standby(self) -> None:
        """SIGKILL to the postmaster and all its processes at once: no goodbye to
        any client, like a replica whose machine died."""
        _kill(self.standby)

    def kill_primary(self) -> None:
        """The primary's machine dies: every one of its processes SIGKILLed."""
        _kill(self.primary)

    async def promote_standby(self) -> None:
        """What an HA manager does once the primary is gone: the standby takes
        writes (``pg_promote`` waits until it does)."""
        await self._on_standby("SELECT pg_promote(true, 30)")

    async def restart_standby(self) -> None:
        url = await asyncio.to_thread(self.standby.start)  # same port: the recorded one
        assert url == self.standby_url
        await self.caught_up()


def _kill(server: EmbeddedPostgres) -> None:
    pid = int((server.pgdata / "postmaster.pid").read_text().split()[0])
    postmaster = psutil.Process(pid)
    everyone = [postmaster, *postmaster.children(recursive=True)]
    for proc in everyone:
        proc.send_signal(signal.SIGKILL)
    deadline = time.monotonic() + 10
    while any(_alive(p) for p in everyone):
        assert time.monotonic() < deadline, "the server outlived SIGKILL"
        time.sleep(0.01)


@asynccontextmanager
async def routed(
    pair: HotStandbyPair, base: Settings, **overrides: Any
) -> AsyncIterator[tuple[Container, httpx.AsyncClient]]:
    """The service on the pair's primary, its standby as the read replica."""
    settings = base.with_(
        **{
            "database_url": pair.primary_url,
            "database_replica_urls": pair.standby_url,
            "redis_namespace": f"test-{uuid.uuid4().hex[:8]}",
            # Every list read below reaches the database unless a test says otherwise.
            "appointments_slots_local_ttl_s": 0.0,
            "appointments_slots_cache_ttl_s": 1,
            "replica_probe_interval_s": 0.05,
            # Generous: a probe that times out on a loaded test machine would mark the
            # replica down and route the read for another reason than the test's.
            "replica_timeout_s": 5.0,
            **overrides,
        }
    )
    container = build(settings, OffsetClock())
    app = create_app(container, owns_container=False)
    try:
        # What the app's lifespan does: connects, and starts the replica probe.
        await container.db.connect()
        container.stale.start()
        async with httpx.AsyncClient(
            transport=httpx.ASGITransport(app=app), base_url="http://reservo.test"
        ) as client:
            yield container, client
    finally:
        await container.close()


def served(pool: str, reason: str) -> float:
    return (
        REGISTRY.get_sample_value("reservo_db_stale_reads_total", {"pool": pool, "reason": reason})
        or 0.0
    )


def serving(c: Container) -> bool:
    assert c.stale.replicas is not None
    return bool(c.stale.replicas.status()[0]["serving"])


@asynccontextmanager
async def started_pair(prefix: str) -> AsyncIterator[HotStandbyPair]:
    """A primary and its hot standby for a test module (or one test), removed after.
    Not under pytest's tmp dir: when we are root the servers run as another user,
    and every pytest session starting on the machine makes that tree 0700 again."""
    if why := missing_binaries():
        pytest.skip(f"no hot standby can be started here: {why}")
    root = Path(tempfile.mkdtemp(prefix=prefix))
    pair = HotStandbyPair(root)
    try:
        await pair.start()
        yield pair
    finally:
        await asyncio.to_thread(pair.stop)
        shutil.rmtree(root, ignore_errors=True)
