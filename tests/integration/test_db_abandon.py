"""A commit that waits for a synchronous standby longer than the statement timeout
answers 503 and stays invisible: reservo closes the connection instead of
cancelling (core/db/abandon.py). A cancelled wait commits locally: the row would
be visible on a primary that no standby acknowledged, which on a primary cut off
by a partition is a write the failover then discards, readable (and replayed to
an Idempotency-Key's retry) meanwhile. Its own PostgreSQL server, since
``synchronous_standby_names`` is server-wide: a standby named ``nobody`` never
connects, so every commit waits."""

from __future__ import annotations

import asyncio
import os
import shutil
import tempfile
from collections.abc import AsyncIterator
from pathlib import Path

import asyncpg
import pytest

from reservo.core.db.database import Database
from reservo.core.embedded import EmbeddedPostgres
from reservo.core.kernel.errors import DomainError
from tests.helpers.procs import free_port

pytestmark = pytest.mark.timeout(120)
MIGRATIONS = Path(__file__).resolve().parents[2] / "src" / "reservo" / "migrations"


@pytest.fixture
async def waiting_server() -> AsyncIterator[str]:
    """A server whose commits wait for a synchronous standby that never comes."""
    # Not under pytest's tmp_path: as root the server runs as postgres, which
    # must be able to reach its data directory.
    root = Path(tempfile.mkdtemp(prefix="reservo-abandon-"))
    os.chmod(root, 0o755)
    pg = EmbeddedPostgres(root, port=free_port())
    url = await asyncio.to_thread(pg.start)
    admin = await asyncpg.connect(url)
    try:
        await admin.execute("CREATE TABLE booking (id int)")
        # The commit guard's table (migration 0060), without the other migrations.
        await admin.execute((MIGRATIONS / "0060_commit_probe.sql").read_text(encoding="utf-8"))
        await admin.execute("ALTER SYSTEM SET synchronous_standby_names = 'nobody'")
        await admin.execute("SELECT pg_reload_conf()")
        yield url
    finally:
        await admin.close()
        await asyncio.to_thread(pg.stop)
        shutil.rmtree(root, ignore_errors=True)


async def test_a_commit_past_its_timeout_is_abandoned_not_cancelled(waiting_server: str) -> None:
    db = Database(waiting_server, min_size=0, max_size=2, command_timeout=1)
    try:
        with pytest.raises(DomainError) as refused:
            async with db.transaction() as conn:
                await conn.execute("INSERT INTO booking VALUES (1)")
        assert refused.value.code == "unavailable"
        # And the autocommit statement: its implicit commit waits the same way.
        with pytest.raises(DomainError):
            async with db.connection() as conn:
                await conn.execute("INSERT INTO booking VALUES (2)")
    finally:
        await db.close()
    check = await asyncpg.connect(waiting_server)
    try:
        await asyncio.sleep(0.5)  # a cancel request, if one was sent, has landed
        assert await check.fetchval("SELECT count(*) FROM booking") == 0, (
            "a commit answered 503 became visible (its wait was cancelled)"
        )
        waiting = await check.fetchval(
            "SELECT count(*) FROM pg_stat_activity WHERE wait_event = 'SyncRep'"
        )
        assert waiting == 2, waiting
    finally:
        await check.close()


async def test_a_primary_whose_commits_stall_answers_nothing(waiting_server: str) -> None:
    """The commit guard (core/db/guard.py): with the probe's commit pending past
    its bound, even a read answers 503 and the readiness check fails, since the
    server may be a primary the failover left behind; once commits complete
    again (here: no standby required any more), requests are answered again."""
    db = Database(waiting_server, min_size=0, max_size=2, commit_probe_s=0.5)
    admin = await asyncpg.connect(waiting_server)
    try:
        async with db.connection() as conn:  # the first request starts a probe
            assert await conn.fetchval("SELECT 1") == 1
        await asyncio.sleep(1.0)
        with pytest.raises(DomainError) as refused:
            async with db.connection() as conn:
                await conn.fetchval("SELECT 1")
        assert refused.value.code == "unavailable"
        assert not await db.ping()
        await admin.execute("ALTER SYSTEM SET synchronous_standby_names = ''")
        await admin.execute("SELECT pg_reload_conf()")
        for _ in range(50):
            if await db.ping():
                break
            await asyncio.sleep(0.1)
        async with db.connection() as conn:
            assert await conn.fetchval("SELECT 1") == 1
    finally:
        await admin.close()
        await db.close()


async def test_no_synchronous_standby_no_probe(database_url: str) -> None:
    """A server whose commits wait for no standby (the shared test server, a
    single primary): the guard writes nothing and never distrusts it, since a
    slow commit there is load, not a partition."""
    db = Database(database_url, min_size=0, max_size=2, commit_probe_s=0.5)
    try:
        for _ in range(4):
            async with db.connection() as conn:
                assert await conn.fetchval("SELECT 1") == 1
            await asyncio.sleep(0.4)
        async with db.connection() as conn:
            assert await conn.fetchval("SELECT count(*) FROM db_commit_probe") == 0
    finally:
        await db.close()


@pytest.mark.parametrize("readonly", [False, True])
async def test_a_transaction_cancelled_mid_statement_raises_its_cancel(
    database_url: str, readonly: bool
) -> None:
    """The cancel closes the connection (it is abandoned, not cancelled on the
    server), so the ROLLBACK cannot be sent: the block's CancelledError is what
    comes out, through asyncpg's own ``conn.transaction()`` (a streamed statement
    uses it) as through ``Database.transaction``; "connection is closed" would
    turn a cancel into a 503."""
    db = Database(database_url, min_size=0, max_size=2)

    async def own_block() -> None:
        async with db.connection() as conn, conn.transaction(readonly=readonly):
            await conn.execute("SELECT pg_sleep(5)")

    async def database_block() -> None:
        async with db.transaction() as conn:
            await conn.execute("SELECT pg_sleep(5)")

    try:
        for block in (own_block, database_block):
            task = asyncio.create_task(block())
            await asyncio.sleep(0.3)
            task.cancel()
            with pytest.raises(asyncio.CancelledError):
                await task
        async with db.connection() as conn:  # and the pool goes on serving
            assert await conn.fetchval("SELECT 1") == 1
    finally:
        await db.close()


async def test_a_statement_cancelled_outside_a_transaction_raises_its_cancel(
    database_url: str,
) -> None:
    """No transaction to roll back: the cancelled block goes straight back to the
    pool, which must find the connection closed and retire it. Closing it from
    the loop's next turn, after the pool had begun returning it, freed the pool's
    holder twice ("release() called on a free connection holder", a 503)."""
    db = Database(database_url, min_size=0, max_size=2)

    async def statement() -> None:
        async with db.connection() as conn:
            await conn.execute("SELECT pg_sleep(5)")

    try:
        for _ in range(3):
            task = asyncio.create_task(statement())
            await asyncio.sleep(0.3)
            task.cancel()
            with pytest.raises(asyncio.CancelledError):
                await task
        async with db.connection() as conn:
            assert await conn.fetchval("SELECT 1") == 1
    finally:
        await db.close()
