"""Applies the numbered SQL files in ``reservo/migrations`` in order, each once,
each in its own transaction, under a transaction-level advisory lock (safe when
several processes migrate at once, and under PgBouncer's transaction mode)."""

from __future__ import annotations

import re
from dataclasses import dataclass
from importlib import resources

import asyncpg

# Any constant shared by every reservo process; "reservo" in ASCII.
_LOCK_ID = 0x7265736572766F
_FILE = re.compile(r"^(?P<version>\d{4})_(?P<name>[a-z0-9_]+)\.sql$")


@dataclass(frozen=True)
class Migration:
    version: int
    name: str
    sql: str


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
        async with conn.transaction():
            await conn.execute("SELECT pg_advisory_xact_lock($1)", _LOCK_ID)
            await conn.execute(
                """CREATE TABLE IF NOT EXISTS schema_migrations (
                       version    integer PRIMARY KEY,
                       name       text NOT NULL,
                       applied_at timestamptz NOT NULL DEFAULT now())"""
            )
        for mig in available(package):
            async with conn.transaction():
                await conn.execute("SELECT pg_advisory_xact_lock($1)", _LOCK_ID)
                done = await conn.fetchval(
                    "SELECT 1 FROM schema_migrations WHERE version = $1", mig.version
                )
                if done:
                    continue
                await conn.execute(mig.sql)
                await conn.execute(
                    "INSERT INTO schema_migrations (version, name) VALUES ($1, $2)",
                    mig.version,
                    mig.name,
                )
                applied.append(mig)
    finally:
        await conn.close()
    return applied
