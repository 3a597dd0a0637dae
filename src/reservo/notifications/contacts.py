"""Where a user's notifications go: an e-mail address, a phone number and up to
five Web Push subscriptions, each optional. User ids are global, so one contact
serves every module's notifications of that user; the notifications consumer
reads the contacts of a batch's recipients."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime

import asyncpg

from reservo.core.db.database import Queries
from reservo.notifications.subscriptions import PushSubscription

Q = Queries.load("reservo.notifications")


@dataclass(frozen=True)
class Contact:
    user_id: int
    email: str | None
    phone: str | None
    push: tuple[PushSubscription, ...] = ()


async def put(
    conn: asyncpg.Connection,
    user_id: int,
    email: str | None,
    phone: str | None,
    push: Sequence[PushSubscription],
    now: datetime,
) -> Contact:
    """Replaces the addresses (None clears one: the channel's default applies)
    and the push subscriptions (the ones not given are deleted). The caller
    checked the subscriptions (subscriptions.subscription_problem), distinct
    endpoints, at most MAX_SUBSCRIPTIONS."""
    row = await conn.fetchrow(Q.contact_put, user_id, email, phone, now)
    await conn.execute(
        Q.push_subscriptions_put,
        user_id,
        [s.endpoint for s in push],
        [s.p256dh for s in push],
        [s.auth for s in push],
        now,
    )
    return Contact(row["user_id"], row["email"], row["phone"], tuple(push))


async def of_many(conn: asyncpg.Connection, user_ids: Sequence[int]) -> dict[int, Contact]:
    rows = await conn.fetch(Q.contact_of_many, list(user_ids))
    return {
        r["user_id"]: Contact(
            r["user_id"], r["email"], r["phone"], tuple(PushSubscription(*s) for s in r["push"])
        )
        for r in rows
    }


async def forget_push(conn: asyncpg.Connection, user_id: int, endpoint: str) -> None:
    """The push service said the subscription is gone (404/410)."""
    await conn.execute(Q.push_subscription_delete, user_id, endpoint)
