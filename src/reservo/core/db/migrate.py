"""Applies the numbered SQL files in ``reservo/migrations`` in order, each once,
each in its own transaction, under a transaction-level advisory lock (safe when
several processes migrate at once, and under PgBouncer's transaction mode).

Migrations run while the previous release serves. A migration that cannot take
its table locks in time (its own ``lock_timeout``) or that PostgreSQL picks as
the victim of a deadlock with a serving transaction is rolled back whole and
tried again after a backoff: the serving process's transaction wins, and the
migration waits for a quiet moment rather than failing the deploy.

The serving transactions must win every lock conflict with a migration, since
the previous release answers a deadlock with a 500. PostgreSQL breaks a
deadlock by aborting the session whose check finds it; a session checks once,
``deadlock_timeout`` (1 s by default) after it began to wait. So the migration's
session (1) checks after ``DEADLOCK_CHECK_MS``: a cycle it closes while a serving
transaction already waits is found by the migration first; and (2) never waits
for a lock longer than half the server's ``deadlock_timeout`` (at most
``LOCK_WAIT_MS``): a cycle a serving transaction closes later, while the
migration waits, ends with the migration's lock timeout before the serving
transaction's check runs. A migration file therefore sets no lock_timeout of
its own."""

from __future__ import annotations

import re
from dataclasses import dataclass
from importlib import resources

import asyncpg
import structlog

from reservo.core.aio.retry import retrying

log = structlog.get_logger(__name__)

# Any constant shared by every reservo process; "reservo" in ASCII.
_LOCK_ID = 0x7265736572766F
_FILE = re.compile(r"^(?P<version>\d{4})_(?P<name>[a-z0-9_]+)\.sql$")
# Lock conflicts with the serving release: worth another try once it has moved on.
_LOCK_CONFLICTS = (asyncpg.LockNotAvailableError, asyncpg.DeadlockDetectedError)
LOCK_ATTEMPTS = 12
DEADLOCK_CHECK_MS = 50
LOCK_WAIT_MS = 500


@dataclass(frozen=True)
class Migration:
    version: int
    name: str
    sql: str


class MigrationFailed(Exception):
    """A migration the database refused (rolled back whole); its cause is the
    database's error."""

    def __init__(self, migration: Migration) -> None:
        super().__init__(f"migration {migration.version:04d}_{migration.name} failed")
        self.migration = migration


def available(package: str = "reservo.migrations") -> list[Migration]:
    found = []
    for entry in resources.files(package).iterdir():
        m = _FILE.match(entry.name)
        if m:
            found.append(Migration(int(m["version"]), m["name"], entry.read_text(encoding="utf-8")))
    found.sort(key=lambda mig: mig.version)
    versions = [mig.version for mig in found]
    if len(set(versions)) != len(versions):
        raise RuntimeError(f"duplicate migration numbers in {package}: {versions}")
    return found


async def migrate(dsn: str, package: str = "reservo.migrations") -> list[Migration]:
    """Returns the migrations this call applied (empty when up to date)."""
    applied: list[Migration] = []
    conn = await asyncpg.connect(dsn)
    try:
        await _lose_deadlocks(conn)
        async with conn.transaction():
            await conn.execute("SELECT pg_advisory_xact_lock($1)", _LOCK_ID)
            await conn.execute(
                """CREATE TABLE IF NOT EXISTS schema_migrations (
                       version    integer PRIMARY KEY,
                       name       text NOT NULL,
                       applied_at timestamptz NOT NULL DEFAULT now())"""
            )
        for mig in available(package):
            if await _apply_retrying(conn, mig):
                applied.append(mig)
    finally:
        await conn.close()
    return applied


async def _lose_deadlocks(conn: asyncpg.Connection) -> None:
    """See the module's docstring; the settings last as long as the session."""
    serving_check_ms = int(
        await conn.fetchval("SELECT setting FROM pg_settings WHERE name = 'deadlock_timeout'")
    )
    wait_ms = max(10, min(LOCK_WAIT_MS, serving_check_ms // 2))
    await conn.execute("SELECT set_config('lock_timeout', $1, false)", f"{wait_ms}ms")
    try:
        await conn.execute(
            "SELECT set_config('deadlock_timeout', $1, false)", f"{DEADLOCK_CHECK_MS}ms"
        )
    except asyncpg.InsufficientPrivilegeError:
        # A superuser setting: without the right, a cycle the migration closes
        # may abort a serving transaction instead (it never fails the migration).
        log.warning(
            "migration_deadlock_timeout_refused",
            hint="GRANT SET ON PARAMETER deadlock_timeout TO the migrating role",
        )


async def _apply_retrying(conn: asyncpg.Connection, mig: Migration) -> bool:
    """Applies one migration, again after a lock conflict (up to LOCK_ATTEMPTS
    tries, backoff up to 5 s, about 40 s in all); False when it was already
    applied."""
    try:
        async for attempt in retrying(
            "db_migrate", attempts=LOCK_ATTEMPTS, base_s=0.2, max_s=5.0, retry_on=_LOCK_CONFLICTS
        ):
            with attempt:
                try:
                    return await _apply(conn, mig)
                except _LOCK_CONFLICTS as exc:
                    log.warning(
                        "migration_lock_conflict",
                        migration=f"{mig.version:04d}_{mig.name}",
                        attempt=attempt.retry_state.attempt_number,
                        of=LOCK_ATTEMPTS,
                        error=type(exc).__name__,
                    )
                    raise
    except _LOCK_CONFLICTS as exc:
        raise MigrationFailed(mig) from exc
    raise AssertionError("unreachable: retrying re-raises after its last attempt")


async def _apply(conn: asyncpg.Connection, mig: Migration) -> bool:
    async with conn.transaction():
        await conn.execute("SELECT pg_advisory_xact_lock($1)", _LOCK_ID)
        done = await conn.fetchval(
            "SELECT 1 FROM schema_migrations WHERE version = $1", mig.version
        )
        if done:
            return False
        try:
            await conn.execute(mig.sql)
        except _LOCK_CONFLICTS:
            raise
        except asyncpg.PostgresError as exc:
            raise MigrationFailed(mig) from exc
        await conn.execute(
            "INSERT INTO schema_migrations (version, name) VALUES ($1, $2)",
            mig.version,
            mig.name,
        )
    return True
