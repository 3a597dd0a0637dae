"""Embedded PostgreSQL and Redis: real servers, real clients, data kept across restarts.

Each test starts real servers in its own tmp_path (initdb about 1 s, starts well
under a second), so the module stays within a few seconds.
"""

from __future__ import annotations

import asyncio
import signal
import sys
import time
from pathlib import Path

import asyncpg
import psutil
import pytest
import redis.asyncio

from reservo.core.embedded import EmbeddedPostgres, EmbeddedRedis

pytestmark = pytest.mark.timeout(60)


def _alive(proc: psutil.Process) -> bool:
    """Running and not a zombie (an exited daemon stays a zombie until init reaps it)."""
    try:
        return bool(proc.status() != psutil.STATUS_ZOMBIE)
    except psutil.NoSuchProcess:
        return False


def _processes_in(directory: Path) -> list[psutil.Process]:
    """Live processes working in ``directory``: what an orphan server would look like."""
    found = []
    for proc in psutil.process_iter():
        try:
            if _alive(proc) and Path(proc.cwd()) == directory:
                found.append(proc)
        except (psutil.NoSuchProcess, psutil.AccessDenied):
            continue
    return found


def _wait_dead(pid: int) -> None:
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        try:
            if psutil.Process(pid).status() == psutil.STATUS_ZOMBIE:
                return
        except psutil.NoSuchProcess:
            return
        time.sleep(0.01)
    raise AssertionError(f"pid {pid} still alive")


async def test_postgres_keeps_data_across_restarts(tmp_path: Path) -> None:
    pg = EmbeddedPostgres(tmp_path)
    dsn = pg.start()
    assert dsn.startswith("postgresql://postgres@127.0.0.1:")
    assert dsn.endswith("/reservo")
    conn = await asyncpg.connect(dsn)
    try:
        await conn.execute("CREATE TABLE kept (id int PRIMARY KEY, note text)")
        await conn.execute("INSERT INTO kept VALUES (1, 'survives')")
    finally:
        await conn.close()
    pg.stop()
    assert _processes_in(pg.pgdata) == []
    pg.stop()  # idempotent

    pg_version_mtime = (pg.pgdata / "PG_VERSION").stat().st_mtime_ns
    again = EmbeddedPostgres(tmp_path)
    dsn2 = again.start()
    try:
        assert dsn2 == dsn  # recorded port was free, so it is reused
        assert (again.pgdata / "PG_VERSION").stat().st_mtime_ns == pg_version_mtime  # no re-init
        conn = await asyncpg.connect(dsn2)
        try:
            assert await conn.fetchval("SELECT note FROM kept WHERE id = 1") == "survives"
        finally:
            await conn.close()
    finally:
        again.stop()
    again.stop()
    assert _processes_in(again.pgdata) == []


def test_postgres_explicit_port_in_use_fails(tmp_path: Path) -> None:
    with EmbeddedPostgres(tmp_path / "a") as first:
        assert first.port is not None
        (tmp_path / "b").mkdir()
        with pytest.raises(RuntimeError):
            EmbeddedPostgres(tmp_path / "b", port=first.port).start()
    assert _processes_in(tmp_path / "b" / "postgres" / "pgdata") == []


async def test_redis_keeps_data_across_restarts(tmp_path: Path) -> None:
    rd = EmbeddedRedis(tmp_path)
    url = rd.start()
    assert url.startswith("redis://127.0.0.1:")
    assert url.endswith("/0")
    client = redis.asyncio.Redis.from_url(url)
    try:
        await client.set("kept", b"survives")
    finally:
        await client.aclose()
    rd.stop()
    assert _processes_in(rd.root) == []
    rd.stop()  # idempotent

    with EmbeddedRedis(tmp_path) as again:
        assert again.url == url
        client = redis.asyncio.Redis.from_url(again.url)
        try:
            assert await client.get("kept") == b"survives"
        finally:
            await client.aclose()
    assert _processes_in(again.root) == []


# A `reservo up` that dies by SIGKILL: committed data is in place, the servers it
# left behind keep running (orphans) and, for PostgreSQL, postmaster.pid stays.
_CRASHING_OWNER = """
import os, signal, sys, asyncio
from pathlib import Path
import asyncpg, redis
from reservo.core.embedded import EmbeddedPostgres, EmbeddedRedis

data = Path(sys.argv[1])
dsn = EmbeddedPostgres(data).start()
url = EmbeddedRedis(data).start()

async def write() -> None:
    conn = await asyncpg.connect(dsn)
    await conn.execute("CREATE TABLE t (v int)")
    await conn.execute("INSERT INTO t VALUES (42)")
    await conn.close()

asyncio.run(write())
client = redis.Redis.from_url(url)
client.set("k", b"v")
client.save()  # appendfsync everysec: make the write durable before the crash
os.kill(os.getpid(), signal.SIGKILL)
"""


async def test_restart_after_owner_crash_stops_orphans(tmp_path: Path) -> None:
    owner = await asyncio.create_subprocess_exec(
        sys.executable, "-c", _CRASHING_OWNER, str(tmp_path), stderr=asyncio.subprocess.PIPE
    )
    _, stderr = await asyncio.wait_for(owner.communicate(), 60)
    assert owner.returncode == -signal.SIGKILL, stderr.decode()
    pg, rd = EmbeddedPostgres(tmp_path), EmbeddedRedis(tmp_path)
    orphans = _processes_in(pg.pgdata) + _processes_in(rd.root)
    assert orphans, "the crashed owner should have left its servers running"
    assert (pg.pgdata / "postmaster.pid").exists()

    with pg, rd:
        conn = await asyncpg.connect(pg.url)
        try:
            assert await conn.fetchval("SELECT v FROM t") == 42
        finally:
            await conn.close()
        client = redis.asyncio.Redis.from_url(rd.url)
        try:
            assert await client.get("k") == b"v"
        finally:
            await client.aclose()
        assert not any(_alive(proc) for proc in orphans)
    assert _processes_in(pg.pgdata) == []
    assert _processes_in(rd.root) == []


def test_second_owner_is_refused(tmp_path: Path) -> None:
    with EmbeddedRedis(tmp_path) as first:
        with pytest.raises(RuntimeError, match="in use"):
            EmbeddedRedis(tmp_path).start()
        EmbeddedRedis(tmp_path).stop()  # not ours: must leave it running
        assert _processes_in(first.root) != []
    assert _processes_in(first.root) == []
