"""The hold rate limit counts holds created, not attempts (second release)."""

from __future__ import annotations

import asyncio
from datetime import timedelta
from typing import Any

import asyncpg
import httpx

from reservo.core.kernel.clock import OffsetClock
from tests.helpers.auth import auth, new_id
from tests.helpers.rentals import at, hold, make_car


async def test_refused_attempts_do_not_count(client: httpx.AsyncClient, clock: OffsetClock) -> None:
    """Three car_unavailable answers in a rush, then the customer's holds are still
    all allowed: only the three created holds count, the fourth is 429."""
    customer = new_id()
    taken, free = await make_car(client), await make_car(client)
    assert (await hold(client, taken["id"], new_id(), at(30), at(40))).status_code == 201
    for _ in range(3):
        r = await hold(client, taken["id"], customer, at(30), at(40))
        assert (r.status_code, r.json()["code"]) == (409, "car_unavailable")
    r = await hold(client, 2**62, customer, at(30), at(40))
    assert (r.status_code, r.json()["code"]) == (404, "car_not_found")
    for i in range(3):
        r = await hold(client, free["id"], customer, at(30 + 20 * i), at(31 + 20 * i))
        assert r.status_code == 201, r.text
    # A cancelled hold still counts: it was created (hold-and-cancel is no way round).
    last = r.json()["bookingId"]
    r = await client.post(f"/api/bookings/{last}/cancel", headers=auth("customer", customer))
    assert r.json()["status"] == "CANCELLED"
    r = await hold(client, free["id"], customer, at(200), at(201))
    assert (r.status_code, r.json()["code"]) == (429, "rate_limited")
    assert 890 <= int(r.headers["Retry-After"]) <= 900
    # 15 minutes later the three holds no longer count.
    clock.advance(timedelta(seconds=901))
    for i in range(3):
        r = await hold(client, free["id"], customer, at(200 + 20 * i), at(201 + 20 * i))
        assert r.status_code == 201, r.text
    r = await hold(client, free["id"], customer, at(300), at(301))
    assert (r.status_code, r.json()["code"]) == (429, "rate_limited")


async def _lock_waiters(conn: asyncpg.Connection) -> int:
    n: int = await conn.fetchval(
        "SELECT count(*) FROM pg_stat_activity"
        " WHERE datname = current_database() AND wait_event_type = 'Lock'"
    )
    return n


async def _until(cond: Any, within_s: float = 10.0) -> bool:
    deadline = asyncio.get_running_loop().time() + within_s
    while asyncio.get_running_loop().time() < deadline:
        if await cond():
            return True
        await asyncio.sleep(0.01)
    return False


async def test_concurrent_holds_never_exceed_the_limit(
    client: httpx.AsyncClient, database_url: str
) -> None:
    """The barrier: N holds of one customer, each on its own car, are all in
    flight together and stopped before their INSERT can finish (each car has an
    overlapping booking in a transaction this test keeps open). Without the
    per-customer lock every one of them counts zero holds and all N commit once
    the barrier is released; with it they count one after the other: exactly 3."""
    n, customer = 8, new_id()
    cars = [await make_car(client) for _ in range(n)]
    start, end = at(30), at(40)
    barrier = await asyncpg.connect(database_url)
    watcher = await asyncpg.connect(database_url)
    try:
        tx = barrier.transaction()
        await tx.start()
        for car in cars:
            await barrier.execute(
                "INSERT INTO booking (car_id, customer_id, period, return_at, status,"
                " deposit_amount, hold_expires_at, created_at, updated_at)"
                " VALUES ($1, $2, tstzrange($3, $4::timestamptz + interval '2 hours'),"
                "         $4, 'HOLD', 0, now() + interval '1 hour', now(), now())",
                car["id"],
                new_id(),
                start,
                end,
            )
        holds = [asyncio.create_task(hold(client, c["id"], customer, start, end)) for c in cars]
        # Every request is in its transaction, waiting: on the barrier's booking
        # (the first, or all n without the lock) or on the customer's lock.
        assert await _until(lambda: _waiting(watcher, n)), "the holds never reached the barrier"
        await tx.rollback()
        results = await asyncio.gather(*holds)
    finally:
        await barrier.close()
    try:
        codes = sorted(
            (r.status_code, r.json().get("code") if r.status_code >= 400 else None) for r in results
        )
        assert codes == [(201, None)] * 3 + [(429, "rate_limited")] * (n - 3), codes
        created = await watcher.fetchval(
            "SELECT count(*) FROM booking WHERE customer_id = $1", customer
        )
        assert created == 3
    finally:
        await watcher.close()


async def _waiting(conn: asyncpg.Connection, n: int) -> bool:
    return await _lock_waiters(conn) >= n
