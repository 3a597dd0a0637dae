"""Where a user's notifications go: an e-mail address and a phone number, each
optional. User ids are global, so one row serves every module's notifications of
that user; the notifications consumer reads the rows of a batch's recipients."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime

import asyncpg

from reservo.core.db.database import Queries

Q = Queries.load("reservo.notifications")


@dataclass(frozen=True)
class Contact:
    user_id: int
    email: str | None
    phone: str | None


async def put(
    conn: asyncpg.Connection, user_id: int, email: str | None, phone: str | None, now: datetime
) -> Contact:
    """Replaces both addresses (None clears one: the channel's default applies)."""
    row = await conn.fetchrow(Q.contact_put, user_id, email, phone, now)
    return Contact(row["user_id"], row["email"], row["phone"])


async def of_many(conn: asyncpg.Connection, user_ids: Sequence[int]) -> dict[int, Contact]:
    rows = await conn.fetch(Q.contact_of_many, list(user_ids))
    return {r["user_id"]: Contact(r["user_id"], r["email"], r["phone"]) for r in rows}
