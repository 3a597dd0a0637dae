"""Rentals, issue 38: a payment that is not exactly the deposit is never kept
silently. More than due answers `overpaid`: the booking is confirmed, the
excess goes back once through the outbox and the refund consumer, and the
booking (API, lists, events, console) shows it as overpaidRefund; a later
cancellation refunds the deposit's share only. Less than due confirms nothing
and goes back in full. All through HTTP, against real PostgreSQL and Redis."""

from __future__ import annotations

import re
import uuid
from datetime import UTC, datetime, timedelta
from typing import Any

import asyncpg
import httpx
import orjson

from reservo.bootstrap import Container
from reservo.core.db.migrate import migrate
from reservo.core.kernel.clock import OffsetClock
from reservo.core_modules import Outbox
from reservo.rentals import events
from reservo.rentals.gateway import SandboxGateway
from reservo.rentals.setup import Rentals
from tests.helpers.auth import auth, new_id
from tests.helpers.console import signed_in
from tests.helpers.databases import DatabaseAt
from tests.helpers.rentals import (
    REFUND_ROWS,
    at,
    hold,
    make_car,
    refund_events,
    released_together,
    settled,
    webhook,
)
from tests.helpers.waiting import drain

# 10 hours of a 10,000-a-day car at the default 0.3 rate: a deposit of 3,000.
DEPOSIT = 3_000
PAID = 503_000
EXCESS = PAID - DEPOSIT


async def a_hold_of_3000(client: httpx.AsyncClient) -> tuple[int, int]:
    """(booking id, customer) of a live HOLD whose deposit is DEPOSIT, starting
    100 h from now (a customer's cancel then refunds the whole deposit)."""
    car = await make_car(client, price=10_000)
    customer = new_id()
    r = await hold(client, car["id"], customer, at(100), at(110))
    assert r.status_code == 201, r.text
    assert r.json()["depositAmount"] == DEPOSIT
    return r.json()["bookingId"], customer


async def booking(client: httpx.AsyncClient, bid: int, customer: int) -> dict[str, Any]:
    r = await client.get(f"/api/bookings/{bid}", headers=auth("customer", customer))
    assert r.status_code == 200, r.text
    got: dict[str, Any] = r.json()
    return got


async def listed(client: httpx.AsyncClient, bid: int, customer: int) -> dict[str, Any]:
    r = await client.get(f"/api/customers/{customer}/bookings", headers=auth("customer", customer))
    assert r.status_code == 200, r.text
    (item,) = [b for b in r.json()["items"] if b["bookingId"] == bid]
    found: dict[str, Any] = item
    return found


async def refunded(container: Container, db: asyncpg.Connection, bid: int) -> list[int]:
    """Runs the relay until nothing is left (the refund consumer pays the refund
    events), then what was refunded for ``bid``: the REFUND rows the consumer
    wrote, checked against what the sandbox gateway was asked to pay."""
    await drain(container.module(Outbox).relay)
    await drain(container.module(Outbox).relay)
    rows = [a for (a,) in await db.fetch(REFUND_ROWS, bid)]
    gateway = container.module(Rentals).gateway
    assert isinstance(gateway, SandboxGateway)
    assert sorted(r.amount for r in gateway.refunds.values() if r.booking_id == bid) == sorted(rows)
    return rows


async def event_payloads(db: asyncpg.Connection, topic: str, bid: int) -> list[dict[str, Any]]:
    rows = await db.fetch(
        "SELECT payload::text FROM outbox WHERE topic = $1 AND payload->>'bookingId' = $2 "
        "ORDER BY id",
        topic,
        str(bid),
    )
    return [orjson.loads(r["payload"]) for r in rows]


async def test_an_overpaid_deposit_is_confirmed_and_only_its_excess_goes_back_once(
    client: httpx.AsyncClient, container: Container, clock: OffsetClock, db: asyncpg.Connection
) -> None:
    bid, customer = await a_hold_of_3000(client)
    txn = f"over-{uuid.uuid4().hex}"
    r = await webhook(client, clock, bid, PAID, txn)
    assert (r.status_code, r.json()) == (200, {"result": "overpaid"})
    # Recorded on the payment, shown on the booking and in its lists.
    assert await settled(db, txn) == (PAID, DEPOSIT, EXCESS, "overpaid")
    seen = await booking(client, bid, customer)
    assert (seen["status"], seen["overpaidRefund"], seen["refundAmount"]) == (
        "CONFIRMED",
        EXCESS,
        None,
    )
    assert (await listed(client, bid, customer))["overpaidRefund"] == EXCESS
    # The confirmed event carries it; one refund event asks for exactly the excess.
    (confirmed,) = await event_payloads(db, events.CONFIRMED, bid)
    assert confirmed["overpaidRefund"] == EXCESS
    assert await refund_events(db, bid) == [EXCESS]
    # A redelivery of the same transaction changes nothing and refunds nothing.
    assert (await webhook(client, clock, bid, PAID, txn)).json() == {"result": "duplicate"}
    assert await refund_events(db, bid) == [EXCESS]
    assert await refunded(container, db, bid) == [EXCESS]
    assert await booking(client, bid, customer) == seen
    # Cancelling 100 h ahead refunds the deposit, never the excess a second time.
    c = await client.post(f"/api/bookings/{bid}/cancel", headers=auth("customer", customer))
    assert (c.json()["refundAmount"], c.json()["overpaidRefund"]) == (DEPOSIT, EXCESS)
    (cancelled,) = await event_payloads(db, events.CANCELLED, bid)
    assert (cancelled["refundAmount"], cancelled["overpaidRefund"]) == (DEPOSIT, EXCESS)
    assert await refunded(container, db, bid) == [EXCESS, DEPOSIT]
    assert sum(await refunded(container, db, bid)) == PAID  # all of it back, once


async def test_the_console_shows_the_overpaid_refund_of_a_booking(
    client: httpx.AsyncClient, clock: OffsetClock
) -> None:
    bid, customer = await a_hold_of_3000(client)
    assert (await webhook(client, clock, bid, PAID)).json() == {"result": "overpaid"}
    await signed_in(client)
    page = await client.get("/console/rentals/bookings", params={"customer": customer})
    assert page.status_code == 200, page.text
    row = re.search(rf"<tr><td>{bid}</td>.*?</tr>", page.text, re.S)
    assert row is not None, page.text
    assert f'<td class="overpaid-refund">{EXCESS}</td>' in row[0]


async def test_a_deposit_paid_exactly_is_confirmed_with_nothing_to_refund(
    client: httpx.AsyncClient, container: Container, clock: OffsetClock, db: asyncpg.Connection
) -> None:
    bid, customer = await a_hold_of_3000(client)
    txn = f"exact-{uuid.uuid4().hex}"
    assert (await webhook(client, clock, bid, DEPOSIT, txn)).json() == {"result": "confirmed"}
    assert await settled(db, txn) == (DEPOSIT, DEPOSIT, 0, "confirmed")
    # 0, not null: a payment confirmed it and nothing of it went back.
    seen = await booking(client, bid, customer)
    assert (seen["status"], seen["overpaidRefund"]) == ("CONFIRMED", 0)
    (confirmed,) = await event_payloads(db, events.CONFIRMED, bid)
    assert confirmed["overpaidRefund"] == 0
    assert await refund_events(db, bid) == []
    assert await refunded(container, db, bid) == []


async def test_an_underpaid_deposit_confirms_nothing_and_goes_back_in_full(
    client: httpx.AsyncClient, container: Container, clock: OffsetClock, db: asyncpg.Connection
) -> None:
    bid, customer = await a_hold_of_3000(client)
    txn = f"short-{uuid.uuid4().hex}"
    r = await webhook(client, clock, bid, DEPOSIT - 1, txn)
    assert (r.status_code, r.json()) == (200, {"result": "refund_requested"})
    assert await settled(db, txn) == (DEPOSIT - 1, DEPOSIT, DEPOSIT - 1, "underpaid")
    seen = await booking(client, bid, customer)
    # Nothing confirmed it: no overpaid refund, null rather than 0.
    assert (seen["status"], seen["overpaidRefund"]) == ("HOLD", None)
    assert await event_payloads(db, events.CONFIRMED, bid) == []
    assert await refunded(container, db, bid) == [DEPOSIT - 1]


async def test_the_same_overpaid_webhook_delivered_at_once_refunds_the_excess_once(
    client: httpx.AsyncClient, container: Container, clock: OffsetClock, db: asyncpg.Connection
) -> None:
    bid, customer = await a_hold_of_3000(client)
    txn = f"race-{uuid.uuid4().hex}"
    n = 12
    answers = await released_together(n, lambda _: webhook(client, clock, bid, PAID, txn))
    assert [r.status_code for r in answers] == [200] * n
    assert sorted(r.json()["result"] for r in answers) == ["duplicate"] * (n - 1) + ["overpaid"]
    assert await settled(db, txn) == (PAID, DEPOSIT, EXCESS, "overpaid")
    assert len(await event_payloads(db, events.CONFIRMED, bid)) == 1
    assert await refund_events(db, bid) == [EXCESS]
    assert await refunded(container, db, bid) == [EXCESS]
    assert (await booking(client, bid, customer))["overpaidRefund"] == EXCESS


async def test_the_migration_shows_the_excess_of_payments_recorded_before_it(
    database_at: DatabaseAt,
) -> None:
    """Deposits settled under 0029 with an excess become `overpaid`, and the
    bookings they confirmed show it; one paid exactly shows 0, one never
    confirmed stays null."""
    url = await database_at(50)
    c = await asyncpg.connect(url)
    try:
        now = datetime.now(UTC)
        car = await c.fetchval(
            "INSERT INTO car (plate, model, city, daily_price, host_id, created_at) "
            "VALUES ('MIG-1', 'Fiat Uno', 'x', 10000, 1, $1) RETURNING id",
            now,
        )
        ids = []
        for day, status in enumerate(("CONFIRMED", "CONFIRMED", "HOLD")):
            start = datetime(2031, 1, 1 + 2 * day, tzinfo=UTC)
            ids.append(
                await c.fetchval(
                    "INSERT INTO booking (car_id, customer_id, period, return_at, status, "
                    "deposit_amount, hold_expires_at, created_at, updated_at) VALUES "
                    "($1, 7, tstzrange($2, $3), $3, $4, 3000, $5, $6, $6) RETURNING id",
                    car,
                    start,
                    start.replace(hour=10),
                    status,
                    now + timedelta(hours=1) if status == "HOLD" else None,
                    now,
                )
            )
        for bid, amount, refund, outcome in (
            (ids[0], 3500, 500, "confirmed"),
            (ids[1], 3000, 0, "confirmed"),
            (ids[2], 100, 100, "underpaid"),
        ):
            await c.execute(
                "INSERT INTO payment (booking_id, provider_txn_id, type, amount, created_at, "
                "amount_due, refund_due, outcome) VALUES ($1, $2, 'DEPOSIT', $3, $4, 3000, $5, $6)",
                bid,
                f"mig-{bid}",
                amount,
                now,
                refund,
                outcome,
            )
        await migrate(url)
        outcomes = await c.fetch("SELECT outcome FROM payment ORDER BY booking_id")
        assert [r["outcome"] for r in outcomes] == ["overpaid", "confirmed", "underpaid"]
        shown = await c.fetch("SELECT overpaid_refund FROM booking ORDER BY id")
        assert [r["overpaid_refund"] for r in shown] == [500, 0, None]
    finally:
        await c.close()
