"""Data access of outgoing webhooks: the statements of queries.sql."""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime, timedelta
from uuid import UUID

import asyncpg

from reservo.core.db.database import Queries
from reservo.webhooks.domain import Delivery, Endpoint

Q = Queries.load("reservo.webhooks")


async def insert_endpoint(
    conn: asyncpg.Connection,
    url: str,
    events: Sequence[str],
    description: str,
    secret: str,
    now: datetime,
) -> Endpoint:
    row = await conn.fetchrow(Q.endpoint_insert, url, list(events), description, secret, now)
    return Endpoint.from_row(row)


async def endpoints(conn: asyncpg.Connection) -> list[Endpoint]:
    return [Endpoint.from_row(r) for r in await conn.fetch(Q.endpoint_list)]


async def endpoint(conn: asyncpg.Connection, endpoint_id: int) -> Endpoint | None:
    row = await conn.fetchrow(Q.endpoint_get, endpoint_id)
    return None if row is None else Endpoint.from_row(row)


async def update_endpoint(
    conn: asyncpg.Connection,
    endpoint_id: int,
    events: Sequence[str] | None,
    description: str | None,
    status: str | None,
) -> Endpoint | None:
    row = await conn.fetchrow(
        Q.endpoint_update,
        endpoint_id,
        None if events is None else list(events),
        description,
        status,
    )
    return None if row is None else Endpoint.from_row(row)


async def delete_endpoint(conn: asyncpg.Connection, endpoint_id: int) -> bool:
    return await conn.fetchval(Q.endpoint_delete, endpoint_id) is not None


async def rotate(
    conn: asyncpg.Connection, endpoint_id: int, secret: str, previous_until: datetime
) -> bool:
    return await conn.fetchval(Q.endpoint_rotate, endpoint_id, secret, previous_until) is not None


async def endpoint_failed(
    conn: asyncpg.Connection, endpoint_id: int, now: datetime, disable_after: timedelta
) -> str | None:
    status: str | None = await conn.fetchval(Q.endpoint_failed, endpoint_id, now, disable_after)
    return status


async def endpoint_succeeded(conn: asyncpg.Connection, endpoint_id: int) -> None:
    await conn.execute(Q.endpoint_succeeded, endpoint_id)


async def fan_out(
    conn: asyncpg.Connection,
    ids: Sequence[UUID],
    types: Sequence[str],
    bodies: Sequence[bytes],
    created: Sequence[datetime],
    now: datetime,
    retry: timedelta,
) -> list[asyncpg.Record]:
    return list(
        await conn.fetch(Q.fan_out, list(ids), list(types), list(bodies), list(created), now, retry)
    )


async def for_attempt(conn: asyncpg.Connection, delivery_id: int) -> asyncpg.Record | None:
    row: asyncpg.Record | None = await conn.fetchrow(Q.delivery_for_attempt, delivery_id)
    return row


async def succeeded(
    conn: asyncpg.Connection, delivery_id: int, turn: int, status_code: int | None, now: datetime
) -> int | None:
    endpoint_id: int | None = await conn.fetchval(
        Q.delivery_succeeded, delivery_id, turn, status_code, now
    )
    return endpoint_id


async def failed(
    conn: asyncpg.Connection,
    delivery_id: int,
    turn: int,
    status_code: int | None,
    error: str,
    next_at: datetime | None,
) -> asyncpg.Record | None:
    row: asyncpg.Record | None = await conn.fetchrow(
        Q.delivery_failed, delivery_id, turn, status_code, error, next_at
    )
    return row


async def given_up(conn: asyncpg.Connection, delivery_id: int, turn: int, why: str) -> None:
    await conn.execute(Q.delivery_given_up, delivery_id, turn, why)


async def redeliver(
    conn: asyncpg.Connection, delivery_id: int, now: datetime, retry: timedelta
) -> asyncpg.Record | None:
    row: asyncpg.Record | None = await conn.fetchrow(Q.delivery_redeliver, delivery_id, now, retry)
    return row


async def delivery(conn: asyncpg.Connection, delivery_id: int) -> Delivery | None:
    row = await conn.fetchrow(Q.delivery_get, delivery_id)
    return None if row is None else Delivery.from_row(row)


async def deliveries(
    conn: asyncpg.Connection, endpoint_id: int, status: str | None, limit: int
) -> list[Delivery]:
    return [
        Delivery.from_row(r) for r in await conn.fetch(Q.delivery_list, endpoint_id, status, limit)
    ]
