"""Rentals, issue 22: a payment confirms only when it covers the deposit (its
excess goes back: test_rentals_overpayment.py); a car is picked up only shortly
before its trip; the sandbox payment page cannot be framed. All through HTTP,
against real PostgreSQL."""

from __future__ import annotations

import base64
import hashlib
import re
import uuid
from collections.abc import AsyncIterator
from typing import Any

import asyncpg
import httpx
import pytest

from reservo.bootstrap import Container
from reservo.core.kernel.clock import OffsetClock
from reservo.core_modules import Outbox
from reservo.rentals import events
from reservo.settings import Settings
from tests.helpers.auth import ADMIN, auth, new_id
from tests.helpers.rentals import (
    REFUND_ROWS,
    at,
    client_with,
    count,
    events_of,
    hold,
    make_car,
    page_of,
    refund_events,
    released_together,
    settled,
    webhook,
)
from tests.helpers.waiting import drain


async def a_hold(client: httpx.AsyncClient, price: int = 10_000) -> tuple[dict[str, Any], int]:
    car = await make_car(client, price=price)
    customer = new_id()
    r = await hold(client, car["id"], customer, at(100), at(110))
    assert r.status_code == 201, r.text
    return r.json(), customer


async def booking_status(db: asyncpg.Connection, booking_id: int) -> str:
    status: str = await db.fetchval("SELECT status FROM booking WHERE id = $1", booking_id)
    return status


# -- payments that differ from the deposit (an overpayment: test_rentals_overpayment.py) ----


async def test_a_payment_below_the_deposit_or_of_nothing_confirms_nothing(
    client: httpx.AsyncClient, container: Container, clock: OffsetClock, db: asyncpg.Connection
) -> None:
    b, customer = await a_hold(client)
    bid, due = b["bookingId"], b["depositAmount"]
    zero, short = f"zero-{uuid.uuid4().hex}", f"short-{uuid.uuid4().hex}"
    # Nothing paid: recorded, nothing to refund, the hold stays a HOLD.
    assert (await webhook(client, clock, bid, 0, zero)).json() == {"result": "ignored"}
    assert await settled(db, zero) == (0, due, 0, "underpaid")
    # Less than due: recorded and returned in full, still a HOLD.
    assert (await webhook(client, clock, bid, due - 1, short)).json() == {
        "result": "refund_requested"
    }
    assert await settled(db, short) == (due - 1, due, due - 1, "underpaid")
    for txn, amount in ((zero, 0), (short, due - 1)):  # replays change nothing
        assert (await webhook(client, clock, bid, amount, txn)).json() == {"result": "duplicate"}
    assert await booking_status(db, bid) == "HOLD"
    assert await events_of(db, events.CONFIRMED, bid) == 0
    assert await refund_events(db, bid) == [due - 1]
    seen = await client.get(f"/api/bookings/{bid}", headers=auth("customer", customer))
    assert seen.json()["status"] == "HOLD" and seen.json()["paymentUrl"] is not None
    await drain(container.module(Outbox).relay)
    assert [a for (a,) in await db.fetch(REFUND_ROWS, bid)] == [due - 1]
    # The customer may still pay in full before the hold runs out.
    assert (await webhook(client, clock, bid, due)).json() == {"result": "confirmed"}
    assert await booking_status(db, bid) == "CONFIRMED"
    assert await refund_events(db, bid) == [due - 1]


async def test_no_booking_owes_nothing_so_a_payment_of_nothing_never_confirms(
    client: httpx.AsyncClient, clock: OffsetClock, db: asyncpg.Connection
) -> None:
    # 1 minor unit a day for an hour at the 0.3 rate rounded to 0 before: a zero
    # webhook then confirmed the hold.
    car = await make_car(client, price=1)
    r = await hold(client, car["id"], new_id(), at(100), at(101))
    b = r.json()
    assert b["depositAmount"] == 1
    q = await client.get(
        f"/api/cars/{car['id']}/quote",
        params={"from": at(200).isoformat(), "to": at(201).isoformat()},
        headers=ADMIN,
    )
    assert q.json()["depositAmount"] == 1
    assert (await webhook(client, clock, b["bookingId"], 0)).json() == {"result": "ignored"}
    assert await booking_status(db, b["bookingId"]) == "HOLD"


async def test_racing_payments_of_one_hold_confirm_once_and_keep_exactly_the_deposit(
    client: httpx.AsyncClient, container: Container, clock: OffsetClock, db: asyncpg.Connection
) -> None:
    b, _ = await a_hold(client)
    bid, due = b["bookingId"], b["depositAmount"]
    # Eight different transactions, each at least the deposit, released together.
    paid = [due + 10 * i for i in range(8)]
    answers = await released_together(8, lambda i: webhook(client, clock, bid, paid[i]))
    results = sorted(r.json()["result"] for r in answers)
    # The one that confirms is `confirmed` if it paid exactly, else `overpaid`.
    assert results[1:] == ["refund_requested"] * 7 and results[0] in ("confirmed", "overpaid")
    assert await booking_status(db, bid) == "CONFIRMED"
    outcomes = await db.fetch(
        "SELECT outcome, count(*) AS n FROM payment WHERE booking_id = $1 AND type = 'DEPOSIT' "
        "GROUP BY outcome",
        bid,
    )
    by_outcome = {r["outcome"]: r["n"] for r in outcomes}
    assert by_outcome.pop(results[0]) == 1 and by_outcome == {"not_payable": 7}
    await drain(container.module(Outbox).relay)
    refunded = sum(a for (a,) in await db.fetch(REFUND_ROWS, bid))
    assert sum(paid) - refunded == due  # the service keeps the deposit, nothing more


async def test_a_webhook_amount_must_be_a_whole_non_negative_number(
    client: httpx.AsyncClient, clock: OffsetClock, db: asyncpg.Connection
) -> None:
    b, _ = await a_hold(client)
    for bad in (-1, 1.5, "100", None, 10**16):
        r = await webhook(client, clock, b["bookingId"], bad)  # type: ignore[arg-type]
        assert (r.status_code, r.json()["code"]) == (422, "validation_error"), bad
    assert (
        await count(db, "SELECT count(*) FROM payment WHERE booking_id = $1", b["bookingId"]) == 0
    )
    assert await booking_status(db, b["bookingId"]) == "HOLD"


# -- pickups only shortly before the trip ----------------------------------------------------


async def confirmed(
    client: httpx.AsyncClient, clock: OffsetClock, start_h: float
) -> tuple[dict[str, Any], dict[str, Any]]:
    car = await make_car(client)
    b = (await hold(client, car["id"], new_id(), at(start_h), at(start_h + 24))).json()
    assert (await webhook(client, clock, b["bookingId"], b["depositAmount"])).json() == {
        "result": "confirmed"
    }
    return car, b


async def test_a_pickup_months_before_the_trip_is_refused_and_changes_nothing(
    client: httpx.AsyncClient, clock: OffsetClock, db: asyncpg.Connection
) -> None:
    car, b = await confirmed(client, clock, start_h=24 * 90)
    bid = b["bookingId"]
    for who in (auth("host", car["hostId"]), ADMIN):
        r = await client.post(f"/api/bookings/{bid}/pickup", headers=who)
        assert r.headers["content-type"].startswith("application/problem+json")
        assert (r.status_code, r.json()["code"]) == (409, "pickup_too_early"), r.text
    # Two hours ahead: still more than the default 60 minutes.
    _, soon = await confirmed(client, clock, start_h=2)
    r = await client.post(f"/api/bookings/{soon['bookingId']}/pickup", headers=ADMIN)
    assert (r.status_code, r.json()["code"]) == (409, "pickup_too_early")
    for refused in (bid, soon["bookingId"]):
        assert await booking_status(db, refused) == "CONFIRMED"
        assert await events_of(db, events.PICKED_UP, refused) == 0
    # So the trip cannot be "returned" either, and stays on the car's calendar.
    r = await client.post(f"/api/bookings/{bid}/return", headers=ADMIN)
    assert (r.status_code, r.json()["code"]) == (409, "invalid_state")
    cal = await client.get(
        f"/api/cars/{car['id']}/calendar",
        params={"from": at(24 * 89).isoformat(), "to": at(24 * 92).isoformat()},
        headers=ADMIN,
    )
    assert [p["bookingId"] for p in cal.json()["periods"]] == [bid]


async def test_a_pickup_within_the_lead_time_goes_on_trip(
    client: httpx.AsyncClient, clock: OffsetClock
) -> None:
    car, b = await confirmed(client, clock, start_h=0.75)
    r = await client.post(
        f"/api/bookings/{b['bookingId']}/pickup", headers=auth("host", car["hostId"])
    )
    assert (r.status_code, r.json()["status"]) == (200, "ON_TRIP"), r.text
    # A booking that is not CONFIRMED is still invalid_state, whatever its start.
    car = await make_car(client)
    h = (await hold(client, car["id"], new_id(), at(24 * 90), at(24 * 91))).json()
    r = await client.post(f"/api/bookings/{h['bookingId']}/pickup", headers=ADMIN)
    assert (r.status_code, r.json()["code"]) == (409, "invalid_state")


@pytest.fixture
async def no_lead(base_settings: Settings, clock: OffsetClock) -> AsyncIterator[httpx.AsyncClient]:
    async for client in client_with(base_settings, clock, rentals_pickup_lead_minutes=0):
        yield client


async def test_the_pickup_lead_time_is_a_setting(
    no_lead: httpx.AsyncClient, clock: OffsetClock
) -> None:
    _, b = await confirmed(no_lead, clock, start_h=0.5)
    r = await no_lead.post(f"/api/bookings/{b['bookingId']}/pickup", headers=ADMIN)
    assert (r.status_code, r.json()["code"]) == (409, "pickup_too_early")


# -- the sandbox page cannot be framed -----------------------------------------------------


def assert_unframeable(r: httpx.Response) -> None:
    assert r.status_code == 200 and r.headers["content-type"].startswith("text/html"), r.text
    policy = r.headers["content-security-policy"]
    assert "frame-ancestors 'none'" in policy
    assert r.headers["x-frame-options"] == "DENY"
    assert r.headers["referrer-policy"] == "no-referrer"
    assert r.headers["cache-control"] == "no-store"
    # The page's own inline style is the only one allowed: by its hash.
    style = re.search(r"<style>(.*?)</style>", r.text, re.S)
    assert style is not None
    digest = base64.b64encode(hashlib.sha256(style[1].encode()).digest()).decode()
    assert f"style-src 'sha256-{digest}'" in policy
    assert "default-src 'none'" in policy and "script" not in r.text


async def test_the_sandbox_payment_page_cannot_be_framed(client: httpx.AsyncClient) -> None:
    b, _ = await a_hold(client)
    path, token = page_of(b)
    assert_unframeable(await client.get(path, params={"token": token}))
    assert_unframeable(await client.post(path, data={"token": token}))
