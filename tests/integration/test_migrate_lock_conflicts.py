"""A migration that meets the serving release's locks waits its turn.

Migrations run while the previous release serves (docs/DEPLOY.md). A migration
that cannot take its table lock within its own ``lock_timeout``, or that
PostgreSQL picks as a deadlock's victim, is rolled back and tried again after a
backoff, so a deploy does not fail because one request held a row for a second.
"""

from __future__ import annotations

import asyncio
import sys
import uuid
from collections.abc import Iterator
from pathlib import Path

import asyncpg
import pytest

from reservo.core.aio.retry import RETRIES
from reservo.core.db.migrate import migrate
from tests.helpers.databases import DatabaseAt

ALTER = """ALTER TABLE lock_probe ADD COLUMN IF NOT EXISTS note text;
"""
# Locks lock_probe first, then the other table: the opposite order of the
# serving transactions below.
ALTER_BOTH = """ALTER TABLE lock_probe ADD COLUMN IF NOT EXISTS note text;
ALTER TABLE lock_other ADD COLUMN IF NOT EXISTS note text;
"""


@pytest.fixture
def migrations(tmp_path: Path) -> Iterator[tuple[Path, str]]:
    """An importable migrations package of the test's own, filled by the test."""
    package = f"lock_conflict_migrations_{uuid.uuid4().hex[:8]}"
    (tmp_path / package).mkdir()
    (tmp_path / package / "__init__.py").write_text("")
    sys.path.insert(0, str(tmp_path))
    yield tmp_path / package, package
    sys.path.remove(str(tmp_path))
    sys.modules.pop(package, None)


def retries() -> float:
    return RETRIES.labels(operation="db_migrate")._value.get()


async def columns(url: str, table: str) -> set[str]:
    conn = await asyncpg.connect(url)
    try:
        rows = await conn.fetch(
            "SELECT column_name FROM information_schema.columns WHERE table_name = $1", table
        )
    finally:
        await conn.close()
    return {r["column_name"] for r in rows}


async def test_a_migration_past_its_lock_timeout_is_tried_again_and_applies(
    database_at: DatabaseAt, migrations: tuple[Path, str]
) -> None:
    url = await database_at(0)
    folder, package = migrations
    (folder / "0001_add_note.sql").write_text(ALTER)
    holder = await asyncpg.connect(url)
    await holder.execute("CREATE TABLE lock_probe (id int)")
    before = retries()
    try:
        # A serving transaction reads the table and keeps its lock for 1.5 s:
        # the runner's lock_timeout (0.5 s, no migration sets its own) expires
        # more than once meanwhile.
        tx = holder.transaction()
        await tx.start()
        await holder.fetch("SELECT * FROM lock_probe")
        migrating = asyncio.create_task(migrate(url, package))
        await asyncio.sleep(1.5)
        assert not migrating.done(), "the migration went through a held lock"
        await tx.commit()
        applied = await asyncio.wait_for(migrating, 30)
    finally:
        await holder.close()
    assert [m.name for m in applied] == ["add_note"]
    assert "note" in await columns(url, "lock_probe")
    assert retries() > before, "no retry was counted"


async def _cycle_with_a_serving_transaction(
    url: str, package: str, migration_name: str, head_start_s: float
) -> None:
    """The serving transaction writes lock_other, lets the migration run for
    ``head_start_s`` (it takes lock_probe), then writes lock_probe and commits;
    ``migration_name`` alone is applied. The serving transaction's writes and
    commit must succeed: a deadlock that aborted it fails the test here."""
    server = await asyncpg.connect(url)
    await server.execute("CREATE TABLE lock_probe (id int); CREATE TABLE lock_other (id int)")
    try:
        tx = server.transaction()
        await tx.start()
        await server.execute("INSERT INTO lock_other VALUES (1)")
        migrating = asyncio.create_task(migrate(url, package))
        await asyncio.sleep(head_start_s)
        await server.execute("INSERT INTO lock_probe VALUES (1)")
        await tx.commit()
        applied = await asyncio.wait_for(migrating, 60)
    finally:
        await server.close()
    assert [m.name for m in applied] == [migration_name]


async def test_a_migration_in_a_deadlock_it_waited_in_first_gives_way_and_applies(
    database_at: DatabaseAt, migrations: tuple[Path, str]
) -> None:
    """The migration takes lock_probe and waits for lock_other; the serving
    transaction then writes lock_probe: a cycle. The serving transaction's
    deadlock check would run 1 s after it began to wait; the migration's lock
    wait (0.5 s) ends first, it is rolled back and tried again once the serving
    transaction has committed, which itself never fails."""
    url = await database_at(0)
    folder, package = migrations
    (folder / "0001_add_notes.sql").write_text(ALTER_BOTH)
    before = retries()
    await _cycle_with_a_serving_transaction(url, package, "add_notes", head_start_s=0.25)
    assert "note" in await columns(url, "lock_probe")
    assert "note" in await columns(url, "lock_other")
    assert retries() > before, "the migration did not give way, or no retry"


async def test_a_serving_transaction_that_waited_first_is_not_the_deadlocks_victim(
    database_at: DatabaseAt, migrations: tuple[Path, str]
) -> None:
    """The cycle the other way round: the serving transaction starts waiting
    first (on the table the migration altered), then the migration asks for the
    table the serving transaction wrote. PostgreSQL's default would abort the
    serving transaction (its deadlock check runs first): a 500 to a user of the
    previous release (0.3.0's booking, whose prepared plan locks appointment
    before time_slot, met 0054 this way). The migration checks for deadlocks
    sooner than any serving session, so it is the one rolled back and retried.
    Its sleep lets the serving transaction wait for lock_probe about 0.6 s
    before the migration asks for lock_other: too late for the migration's own
    lock wait (0.5 s) to end before the serving transaction's check (1 s)."""
    url = await database_at(0)
    folder, package = migrations
    (folder / "0001_add_notes_slowly.sql").write_text(
        ALTER_BOTH.replace(
            "ALTER TABLE lock_other", "SELECT pg_sleep(0.9);\nALTER TABLE lock_other"
        )
    )
    before = retries()
    await _cycle_with_a_serving_transaction(url, package, "add_notes_slowly", head_start_s=0.3)
    assert "note" in await columns(url, "lock_other")
    assert retries() > before, "no deadlock, or the migration was not retried"
