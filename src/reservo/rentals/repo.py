"""The only place that runs the rentals module's SQL."""

from __future__ import annotations

from datetime import datetime, timedelta
from typing import TypeAlias

import asyncpg

from reservo.core.db.database import Queries
from reservo.rentals.domain import StoredPeriod

Q = Queries.load("reservo.rentals")

Row: TypeAlias = asyncpg.Record


def _range(p: StoredPeriod) -> asyncpg.Range:
    return asyncpg.Range(p.lower, p.upper, lower_inc=True, upper_inc=False)


async def insert_car(
    conn: asyncpg.Connection,
    plate: str,
    model: str,
    city: str,
    daily_price: int,
    host_id: int,
    now: datetime,
) -> Row:
    return await conn.fetchrow(Q.insert_car, plate, model, city, daily_price, host_id, now)


async def get_car(conn: asyncpg.Connection, car_id: int) -> Row | None:
    return await conn.fetchrow(Q.get_car, car_id)


async def search_available(
    conn: asyncpg.Connection,
    city: str,
    period: StoredPeriod,
    now: datetime,
    limit: int,
    after: tuple[int, int] | None,
) -> list[Row]:
    """``limit`` free cars of ``city`` after the (daily_price, id) ``after``."""
    price, car_id = after or (0, 0)
    return list(
        await conn.fetch(Q.search_available, city, _range(period), now, limit, price, car_id)
    )


async def expire_overlapping(
    conn: asyncpg.Connection, car_id: int, period: StoredPeriod, now: datetime
) -> list[Row]:
    return list(await conn.fetch(Q.expire_overlapping, car_id, _range(period), now))


async def insert_hold(
    conn: asyncpg.Connection,
    car_id: int,
    customer_id: int,
    period: StoredPeriod,
    return_at: datetime,
    deposit: int,
    hold_expires_at: datetime,
    now: datetime,
) -> Row:
    return await conn.fetchrow(
        Q.insert_hold,
        car_id,
        customer_id,
        _range(period),
        return_at,
        deposit,
        hold_expires_at,
        now,
    )


async def get_booking(conn: asyncpg.Connection, booking_id: int) -> Row | None:
    return await conn.fetchrow(Q.get_booking, booking_id)


async def insert_deposit(
    conn: asyncpg.Connection, booking_id: int, txn_id: str, amount: int, now: datetime
) -> int | None:
    """The new payment's id, or None when that transaction was recorded already."""
    payment_id: int | None = await conn.fetchval(Q.insert_deposit, booking_id, txn_id, amount, now)
    return payment_id


async def settle_deposit(
    conn: asyncpg.Connection, payment_id: int, due: int, refund: int, outcome: str
) -> None:
    await conn.execute(Q.settle_deposit, payment_id, due, refund, outcome)


async def set_overpaid_refund(conn: asyncpg.Connection, booking_id: int, amount: int) -> None:
    await conn.execute(Q.set_overpaid_refund, booking_id, amount)


async def confirm(
    conn: asyncpg.Connection, booking_id: int, amount: int, now: datetime
) -> Row | None:
    return await conn.fetchrow(Q.confirm, booking_id, amount, now)


async def cancel(
    conn: asyncpg.Connection, booking_id: int, now: datetime, cancelled_by: str
) -> Row | None:
    return await conn.fetchrow(Q.cancel, booking_id, now, cancelled_by)


async def set_refund(conn: asyncpg.Connection, booking_id: int, amount: int) -> None:
    await conn.execute(Q.set_refund, booking_id, amount)


async def transition(
    conn: asyncpg.Connection, booking_id: int, from_status: str, to_status: str, now: datetime
) -> Row | None:
    return await conn.fetchrow(Q.transition, booking_id, from_status, to_status, now)


async def pick_up(
    conn: asyncpg.Connection, booking_id: int, now: datetime, starts_by: datetime
) -> Row | None:
    return await conn.fetchrow(Q.pick_up, booking_id, now, starts_by)


async def expire_one(conn: asyncpg.Connection, booking_id: int, now: datetime) -> Row | None:
    return await conn.fetchrow(Q.expire_one, booking_id, now)


async def extend_hold(
    conn: asyncpg.Connection, booking_id: int, now: datetime, extension: timedelta
) -> Row | None:
    return await conn.fetchrow(Q.extend_hold, booking_id, now, extension)


async def sweep(conn: asyncpg.Connection, now: datetime, limit: int) -> list[Row]:
    return list(await conn.fetch(Q.sweep, now, limit))


async def refund_recorded(conn: asyncpg.Connection, txn_id: str) -> bool:
    return bool(await conn.fetchval(Q.refund_recorded, txn_id))


async def insert_refund(
    conn: asyncpg.Connection,
    booking_id: int,
    txn_id: str,
    amount: int,
    gateway_ref: str,
    now: datetime,
) -> bool:
    found = await conn.fetchval(Q.insert_refund, booking_id, txn_id, amount, gateway_ref, now)
    return found is not None


# -- second release: the hold rate limit, lists, calendar, quote ---------------------


async def lock_customer_holds(conn: asyncpg.Connection, customer_id: int) -> None:
    await conn.execute(Q.lock_customer_holds, customer_id)


async def recent_holds(
    conn: asyncpg.Connection, customer_id: int, since: datetime, limit: int
) -> list[datetime]:
    rows = await conn.fetch(Q.recent_holds, customer_id, since, limit)
    return [r["created_at"] for r in rows]


async def customer_bookings(
    conn: asyncpg.Connection,
    customer_id: int,
    before: tuple[datetime, int],
    limit: int,
    status: str | None,
    now: datetime,
) -> list[Row]:
    if status is None:
        return list(await conn.fetch(Q.customer_bookings, customer_id, *before, limit))
    return list(
        await conn.fetch(Q.customer_bookings_by_status, customer_id, *before, limit, status, now)
    )


async def car_calendar(
    conn: asyncpg.Connection, car_id: int, window: StoredPeriod, now: datetime
) -> list[Row]:
    return list(await conn.fetch(Q.car_calendar, car_id, _range(window), now))


async def car_is_free(
    conn: asyncpg.Connection, car_id: int, period: StoredPeriod, now: datetime
) -> bool:
    return bool(await conn.fetchval(Q.car_is_free, car_id, _range(period), now))
