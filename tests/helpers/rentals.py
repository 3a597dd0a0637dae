"""Builders shared by the rentals tests."""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import AsyncIterator
from datetime import UTC, datetime, timedelta
from typing import Any
from urllib.parse import parse_qs, urlsplit

import asyncpg
import httpx
import orjson

from reservo.app import create_app
from reservo.bootstrap import build
from reservo.core.http.auth import sign_webhook
from reservo.core.kernel.clock import OffsetClock
from reservo.rentals import events
from reservo.settings import Settings
from tests.helpers.auth import ADMIN, PAY_SECRET, auth, new_id

# What the refund consumer recorded for a booking, and what its refund events asked.
REFUND_ROWS = "SELECT amount FROM payment WHERE booking_id = $1 AND type = 'REFUND' ORDER BY id"
REFUND_EVENTS = (
    "SELECT (payload->>'amount')::bigint FROM outbox WHERE topic = $1 "
    "AND payload->>'bookingId' = $2 ORDER BY id"
)


def at(hours: float) -> datetime:
    """A whole-minute instant ``hours`` from now."""
    t = datetime.now(UTC) + timedelta(hours=hours)
    return t.replace(second=0, microsecond=0)


async def make_car(
    client: httpx.AsyncClient, host: int | None = None, city: str | None = None, price: int = 10_000
) -> dict[str, Any]:
    body = {
        "plate": f"T-{uuid.uuid4().hex[:10]}",
        "model": "Fiat Uno",
        "city": city or f"city-{new_id()}",
        "dailyPrice": price,
        "hostId": host or new_id(),
    }
    r = await client.post("/api/cars", json=body, headers=ADMIN)
    assert r.status_code == 201, r.text
    car: dict[str, Any] = r.json()
    return car


async def hold(
    client: httpx.AsyncClient,
    car_id: int,
    customer: int,
    start: datetime,
    end: datetime,
    key: str | None = None,
) -> httpx.Response:
    headers = {**auth("customer", customer), "Idempotency-Key": key or str(uuid.uuid4())}
    body = {
        "carId": car_id,
        "customerId": customer,
        "from": start.isoformat(),
        "to": end.isoformat(),
    }
    return await client.post("/api/bookings", json=body, headers=headers)


async def webhook(
    client: httpx.AsyncClient,
    clock: OffsetClock,
    booking_id: int,
    amount: int,
    txn: str | None = None,
    secret: str = PAY_SECRET,
) -> httpx.Response:
    raw = orjson.dumps(
        {
            "bookingId": booking_id,
            "providerTxnId": txn or f"txn-{uuid.uuid4().hex}",
            "amount": amount,
            "status": "SUCCEEDED",
        }
    )
    sig = sign_webhook(secret, raw, int(clock.now().timestamp()))
    return await client.post(
        "/api/payments/webhook",
        content=raw,
        headers={"X-Signature": sig, "Content-Type": "application/json"},
    )


async def confirmed_booking(
    client: httpx.AsyncClient, clock: OffsetClock, start_h: float, days: float = 1
) -> tuple[dict[str, Any], dict[str, Any], int]:
    car = await make_car(client)
    customer = new_id()
    r = await hold(client, car["id"], customer, at(start_h), at(start_h + 24 * days))
    assert r.status_code == 201, r.text
    b = r.json()
    w = await webhook(client, clock, b["bookingId"], b["depositAmount"])
    assert w.json() == {"result": "confirmed"}, w.text
    return car, b, customer


def page_of(b: dict[str, Any]) -> tuple[str, str]:
    """(path, token) of a booking's paymentUrl: the sandbox page and its link token."""
    url = urlsplit(b["paymentUrl"])
    assert url.path == f"/sandbox/pay/{b['bookingId']}", b["paymentUrl"]
    token = parse_qs(url.query)["token"]
    assert len(token) == 1 and len(token[0]) == 32
    return url.path, token[0]


async def count(db: asyncpg.Connection, sql: str, *args: Any) -> int:
    return int(await db.fetchval(sql, *args))


async def events_of(db: asyncpg.Connection, topic: str, booking_id: int) -> int:
    return await count(
        db,
        "SELECT count(*) FROM outbox WHERE topic = $1 AND payload->>'bookingId' = $2",
        topic,
        str(booking_id),
    )


async def client_with(
    base_settings: Settings, clock: OffsetClock, **update: Any
) -> AsyncIterator[httpx.AsyncClient]:
    c = build(base_settings.with_(**update), clock)
    app = create_app(c, owns_container=False)
    async with httpx.AsyncClient(
        transport=httpx.ASGITransport(app=app), base_url="http://reservo.test"
    ) as client:
        yield client
    await c.close()


async def refund_events(db: asyncpg.Connection, booking_id: int) -> list[int]:
    return [a for (a,) in await db.fetch(REFUND_EVENTS, events.REFUND_REQUESTED, str(booking_id))]


async def settled(db: asyncpg.Connection, txn: str) -> tuple[int, int, int, str]:
    row = await db.fetchrow(
        "SELECT amount, amount_due, refund_due, outcome FROM payment WHERE provider_txn_id = $1",
        txn,
    )
    assert row is not None, txn
    return row["amount"], row["amount_due"], row["refund_due"], row["outcome"]


async def released_together(n: int, call: Any) -> list[httpx.Response]:
    """``n`` calls of ``call(i)`` started together behind one barrier."""
    gate = asyncio.Event()

    async def one(i: int) -> httpx.Response:
        await gate.wait()
        response: httpx.Response = await call(i)
        return response

    tasks = [asyncio.create_task(one(i)) for i in range(n)]
    await asyncio.sleep(0.05)
    gate.set()
    return list(await asyncio.gather(*tasks))
