"""The console's reads (queries.sql): read-only, indexed, capped; and its
signed-out sessions."""

from __future__ import annotations

from datetime import datetime
from typing import Any

import asyncpg

from reservo.core.db.database import Queries

Q = Queries.load("reservo.console")
CORE = Queries.load("reservo.core.messaging")
Row = Any


async def backlog(conn: asyncpg.Connection, now: datetime) -> Row:
    """The outbox backlog and dead letters, as /readyz shows them."""
    return await conn.fetchrow(CORE.backlog, now)


async def settling_matches(conn: asyncpg.Connection, limit: int, cap: int) -> list[Row]:
    return list(await conn.fetch(Q.settling_matches, limit, cap))


async def jobs_due(conn: asyncpg.Connection, now: datetime, cap: int) -> Row:
    return await conn.fetchrow(Q.jobs_due, now, cap)


async def latest_appointments(conn: asyncpg.Connection, limit: int) -> list[Row]:
    return list(await conn.fetch(Q.latest_appointments, limit))


async def pending_legs(conn: asyncpg.Connection, match_ids: list[int], cap: int) -> list[Row]:
    return list(await conn.fetch(Q.pending_legs, match_ids, cap))


async def job_status_counts(conn: asyncpg.Connection, statuses: list[str], cap: int) -> list[Row]:
    return list(await conn.fetch(Q.job_status_counts, cap, statuses))


async def dead_letters_waiting(conn: asyncpg.Connection, cap: int) -> list[Row]:
    return list(await conn.fetch(Q.dead_letters_waiting, cap))


async def session_revoked(conn: asyncpg.Connection, session_id: str) -> bool:
    return bool(await conn.fetchval(Q.session_revoked, session_id))


async def revoke_session(
    conn: asyncpg.Connection, session_id: str, expires: datetime, now: datetime
) -> None:
    await conn.execute(Q.revoke_session, session_id, expires, now)


# -- finding things by name (search.py, people.py) -------------------------------


def contains(text: str) -> str:
    """The ILIKE pattern of names containing ``text`` as typed: its own ``%``,
    ``_`` and ``\\`` match themselves, never as wildcards."""
    escaped = text.replace("\\", "\\\\").replace("%", "\\%").replace("_", "\\_")
    return f"%{escaped}%"


async def find_doctors(
    conn: asyncpg.Connection, text: str, after: tuple[str, int], limit: int
) -> list[Row]:
    return list(await conn.fetch(Q.find_doctors, contains(text), *after, limit))


async def doctors_by_id(conn: asyncpg.Connection, ids: list[int]) -> dict[int, Row]:
    return {r["id"]: r for r in await conn.fetch(Q.doctors_by_id, ids)}


async def find_cars(
    conn: asyncpg.Connection, text: str, after: tuple[str, int], limit: int
) -> list[Row]:
    return list(await conn.fetch(Q.find_cars, contains(text), *after, limit))


async def find_matches(
    conn: asyncpg.Connection, text: str, before: tuple[datetime, int], limit: int
) -> list[Row]:
    return list(await conn.fetch(Q.find_matches, contains(text), *before, limit))


async def find_contacts(conn: asyncpg.Connection, text: str, after: int, limit: int) -> list[int]:
    return [r["user_id"] for r in await conn.fetch(Q.find_contacts, contains(text), after, limit)]


async def people(conn: asyncpg.Connection, ids: list[int]) -> list[Row]:
    return list(await conn.fetch(Q.people, ids))


async def wallet_accounts_of(conn: asyncpg.Connection, ids: list[int], cap: int) -> list[Row]:
    return list(await conn.fetch(Q.wallet_accounts_of, ids, cap))
