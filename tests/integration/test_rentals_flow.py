"""Rentals through HTTP against real PostgreSQL and Redis: races, buffers,
expiry, webhooks, refunds, lifecycle."""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import AsyncIterator
from datetime import timedelta

import asyncpg
import httpx
import orjson
import pytest
from structlog.testing import capture_logs

from reservo.app import create_app
from reservo.bootstrap import Container, build
from reservo.core.kernel.clock import OffsetClock
from reservo.core_modules import Outbox
from reservo.rentals import events
from reservo.rentals.gateway import SandboxGateway, link_token
from reservo.rentals.setup import Rentals
from reservo.settings import Settings
from tests.helpers.auth import PAY_SECRET, auth, new_id
from tests.helpers.rentals import (
    at,
    client_with,
    confirmed_booking,
    count,
    events_of,
    hold,
    make_car,
    page_of,
    webhook,
)
from tests.helpers.waiting import drain

ADMIN = auth("admin", 1)

# No two active bookings of one car overlap: the invariant, checked in SQL.
OVERLAPS = """
SELECT count(*) FROM booking a JOIN booking b
  ON a.car_id = b.car_id AND a.id < b.id AND a.period && b.period
 WHERE a.status IN ('HOLD', 'CONFIRMED', 'ON_TRIP')
   AND b.status IN ('HOLD', 'CONFIRMED', 'ON_TRIP')
   AND a.car_id = ANY($1::bigint[])
"""


@pytest.fixture
async def zero_buffer(
    base_settings: Settings, clock: OffsetClock
) -> AsyncIterator[httpx.AsyncClient]:
    async for client in client_with(base_settings, clock, rentals_turnaround_minutes=0):
        yield client


@pytest.fixture
async def patient_client(
    base_settings: Settings, clock: OffsetClock
) -> AsyncIterator[httpx.AsyncClient]:
    """100 requests share a 30-connection pool: on a busy shared machine they may
    queue longer than the default 5 s acquire timeout (503), which is not what the
    race test is about."""
    async for client in client_with(base_settings, clock, db_acquire_timeout_s=60.0):
        yield client


# -- exclusivity -----------------------------------------------------------------


async def test_100_customers_racing_for_one_car_get_exactly_one_hold(
    patient_client: httpx.AsyncClient, db: asyncpg.Connection
) -> None:
    client = patient_client
    car = await make_car(client)
    gate = asyncio.Event()
    base = at(48)

    async def one(i: int) -> httpx.Response:
        # Every period contains [base + 20h, base + 24h): all overlap each other.
        start = base + timedelta(hours=i % 20)
        end = base + timedelta(hours=24 + i % 7)
        await gate.wait()
        return await hold(client, car["id"], new_id(), start, end)

    tasks = [asyncio.create_task(one(i)) for i in range(100)]
    await asyncio.sleep(0.05)
    gate.set()
    responses = await asyncio.gather(*tasks)
    codes = sorted(r.status_code for r in responses)
    assert codes.count(201) == 1, codes
    assert codes.count(409) == 99, codes
    assert {r.json()["code"] for r in responses if r.status_code == 409} == {"car_unavailable"}
    assert await count(db, OVERLAPS, [car["id"]]) == 0
    active = "SELECT count(*) FROM booking WHERE car_id = $1 AND status = 'HOLD'"
    assert await count(db, active, car["id"]) == 1


async def test_adjacent_periods_conflict_only_within_the_turnaround_buffer(
    client: httpx.AsyncClient, zero_buffer: httpx.AsyncClient, db: asyncpg.Connection
) -> None:
    t0, t1, t2 = at(30), at(54), at(78)
    # Buffer 0: [t0, t1) and [t1, t2) do not overlap.
    car = await make_car(zero_buffer)
    assert (await hold(zero_buffer, car["id"], new_id(), t0, t1)).status_code == 201
    assert (await hold(zero_buffer, car["id"], new_id(), t1, t2)).status_code == 201
    # Default buffer (120 min): the next trip may start only once it has passed.
    car = await make_car(client)
    assert (await hold(client, car["id"], new_id(), t0, t1)).status_code == 201
    r = await hold(client, car["id"], new_id(), t1, t2)
    assert r.status_code == 409 and r.json()["code"] == "car_unavailable"
    r = await hold(client, car["id"], new_id(), t1 + timedelta(minutes=119), t2)
    assert r.status_code == 409
    r = await hold(client, car["id"], new_id(), t1 + timedelta(minutes=120), t2)
    assert r.status_code == 201, r.text
    stored = await db.fetchval(
        "SELECT upper(period) - return_at FROM booking WHERE id = $1", r.json()["bookingId"]
    )
    assert stored == timedelta(minutes=120)
    assert await count(db, OVERLAPS, [car["id"]]) == 0


async def test_expired_hold_never_blocks_a_booking_nor_hides_the_car(
    client: httpx.AsyncClient, clock: OffsetClock, db: asyncpg.Connection
) -> None:
    car = await make_car(client)
    start, end = at(72), at(96)
    first = await hold(client, car["id"], new_id(), start, end)
    assert first.status_code == 201
    first_id = first.json()["bookingId"]
    clock.advance(timedelta(seconds=901))  # no job or sweeper has run
    assert await db.fetchval("SELECT status FROM booking WHERE id = $1", first_id) == "HOLD"
    found = await client.get(
        "/api/cars",
        params={"city": car["city"], "from": start.isoformat(), "to": end.isoformat()},
        headers=auth("customer", new_id()),
    )
    assert found.status_code == 200
    assert [c["id"] for c in found.json()["items"]] == [car["id"]]
    second = await hold(client, car["id"], new_id(), start, end)
    assert second.status_code == 201, second.text
    # The stale hold was flipped in the booking's own transaction, with its event.
    assert await db.fetchval("SELECT status FROM booking WHERE id = $1", first_id) == "EXPIRED"
    assert await events_of(db, events.EXPIRED, first_id) == 1
    assert await count(db, OVERLAPS, [car["id"]]) == 0


async def test_sweeper_and_expiry_job_flip_holds_once(
    client: httpx.AsyncClient, container: Container, clock: OffsetClock, db: asyncpg.Connection
) -> None:
    car = await make_car(client)
    customer = new_id()
    a = (await hold(client, car["id"], customer, at(30), at(40))).json()
    b = (await hold(client, car["id"], customer, at(50), at(60))).json()
    # One expiry job per hold, written in the hold's transaction, due at its expiry.
    job = await db.fetchrow(
        "SELECT j.id, j.run_at = b.hold_expires_at AS on_time FROM scheduled_job j "
        "JOIN booking b ON b.id = (j.payload->>'bookingId')::bigint "
        "WHERE j.category = 'rentals.expire-hold' AND b.id = $1",
        a["bookingId"],
    )
    assert job is not None and job["on_time"]
    seen = await client.get(f"/api/bookings/{a['bookingId']}", headers=auth("customer", customer))
    assert seen.json()["status"] == "HOLD"
    page_of(seen.json())  # the sandbox page's tokenised link
    clock.advance(timedelta(seconds=901))
    seen = await client.get(f"/api/bookings/{a['bookingId']}", headers=auth("customer", customer))
    assert seen.json()["status"] == "EXPIRED"  # read as expired before any flip
    # The job, run through the scheduler's registered handler (twice: idempotent).
    handler = container.scheduler.handlers["rentals.expire-hold"]
    for _ in range(2):
        await handler(await container.scheduler.get(job["id"]))
    assert await db.fetchval("SELECT status FROM booking WHERE id = $1", a["bookingId"]) == (
        "EXPIRED"
    )
    await container.module(Rentals).service.sweep()
    await container.module(Rentals).service.sweep()
    rows = await db.fetch(
        "SELECT status FROM booking WHERE id = ANY($1::bigint[])", [a["bookingId"], b["bookingId"]]
    )
    assert [r["status"] for r in rows] == ["EXPIRED", "EXPIRED"]
    for bid in (a["bookingId"], b["bookingId"]):
        assert await events_of(db, events.EXPIRED, bid) == 1


# -- payments --------------------------------------------------------------------


async def test_same_webhook_ten_times_concurrently_pays_and_confirms_once(
    client: httpx.AsyncClient, clock: OffsetClock, db: asyncpg.Connection
) -> None:
    car = await make_car(client, price=12_345)
    b = (await hold(client, car["id"], new_id(), at(100), at(124))).json()
    assert b["depositAmount"] == 3_704  # ceil(1 day) * 12345 * 0.3 = 3703.5 -> 3704
    txn = f"txn-{uuid.uuid4().hex}"
    gate = asyncio.Event()

    async def deliver() -> httpx.Response:
        await gate.wait()
        return await webhook(client, clock, b["bookingId"], b["depositAmount"], txn)

    tasks = [asyncio.create_task(deliver()) for _ in range(10)]
    await asyncio.sleep(0.05)
    gate.set()
    results = sorted(r.json()["result"] for r in await asyncio.gather(*tasks))
    assert results == ["confirmed"] + ["duplicate"] * 9
    assert await count(db, "SELECT count(*) FROM payment WHERE provider_txn_id = $1", txn) == 1
    assert await events_of(db, events.CONFIRMED, b["bookingId"]) == 1
    assert await events_of(db, events.REFUND_REQUESTED, b["bookingId"]) == 0
    status = await db.fetchval("SELECT status FROM booking WHERE id = $1", b["bookingId"])
    assert status == "CONFIRMED"


async def expiry_job_status(db: asyncpg.Connection, booking_id: int) -> str:
    status: str = await db.fetchval(
        "SELECT status FROM scheduled_job WHERE category = 'rentals.expire-hold' "
        "AND (payload->>'bookingId')::bigint = $1",
        booking_id,
    )
    return status


async def test_paying_or_cancelling_a_hold_cancels_its_expiry_job(
    client: httpx.AsyncClient, clock: OffsetClock, db: asyncpg.Connection
) -> None:
    car = await make_car(client)
    customer = new_id()
    paid = (await hold(client, car["id"], customer, at(100), at(110))).json()
    dropped = (await hold(client, car["id"], customer, at(200), at(210))).json()
    kept = (await hold(client, car["id"], customer, at(300), at(310))).json()
    for b in (paid, dropped, kept):
        assert await expiry_job_status(db, b["bookingId"]) in {"SCHEDULED", "QUEUED"}
    txn = f"txn-{uuid.uuid4().hex}"
    r = await webhook(client, clock, paid["bookingId"], paid["depositAmount"], txn)
    assert r.json()["result"] == "confirmed"
    r = await client.post(
        f"/api/bookings/{dropped['bookingId']}/cancel", headers=auth("customer", customer)
    )
    assert r.status_code == 200, r.text
    # Nothing left to expire: the jobs are cancelled with the status change.
    assert await expiry_job_status(db, paid["bookingId"]) == "CANCELLED"
    assert await expiry_job_status(db, dropped["bookingId"]) == "CANCELLED"
    assert await expiry_job_status(db, kept["bookingId"]) in {"SCHEDULED", "QUEUED"}


async def test_webhook_after_expiry_refunds_and_the_car_stays_with_its_new_holder(
    client: httpx.AsyncClient, container: Container, clock: OffsetClock, db: asyncpg.Connection
) -> None:
    car = await make_car(client)
    late = (await hold(client, car["id"], new_id(), at(100), at(130))).json()
    clock.advance(timedelta(seconds=901))
    winner = await hold(client, car["id"], new_id(), at(110), at(120))
    assert winner.status_code == 201
    w = await webhook(client, clock, late["bookingId"], late["depositAmount"])
    assert w.json() == {"result": "refund_requested"}
    assert await events_of(db, events.REFUND_REQUESTED, late["bookingId"]) == 1
    states = dict(
        await db.fetch("SELECT id, status FROM booking WHERE car_id = $1 ORDER BY id", car["id"])
    )
    assert states == {late["bookingId"]: "EXPIRED", winner.json()["bookingId"]: "HOLD"}
    # The refund consumer executes it once, even when the event is delivered again.
    await drain(container.module(Outbox).relay)
    refunds = "SELECT count(*) FROM payment WHERE booking_id = $1 AND type = 'REFUND'"
    assert await count(db, refunds, late["bookingId"]) == 1
    amount = await db.fetchval(
        "SELECT amount FROM payment WHERE booking_id = $1 AND type = 'REFUND'", late["bookingId"]
    )
    assert amount == late["depositAmount"]
    row = await db.fetchrow(
        "SELECT event_id, topic, key, payload, created_at FROM outbox "
        "WHERE topic = $1 AND payload->>'bookingId' = $2",
        events.REFUND_REQUESTED,
        str(late["bookingId"]),
    )
    from reservo.core.messaging.transport.base import Event

    event = Event(
        row["event_id"],
        row["topic"],
        row["key"],
        orjson.loads(row["payload"]) if isinstance(row["payload"], str) else row["payload"],
        row["created_at"],
    )
    for sub in container.subscriptions.for_topic(events.REFUND_REQUESTED):
        await sub.handler(event)
    assert await count(db, refunds, late["bookingId"]) == 1


async def test_double_cancel_refunds_once(
    client: httpx.AsyncClient, container: Container, clock: OffsetClock, db: asyncpg.Connection
) -> None:
    _, b, customer = await confirmed_booking(client, clock, start_h=100)
    headers = auth("customer", customer)
    url = f"/api/bookings/{b['bookingId']}/cancel"
    first, second = await asyncio.gather(
        client.post(url, headers=headers), client.post(url, headers=headers)
    )
    assert (first.status_code, second.status_code) == (200, 200), (first.text, second.text)
    for r in (first, second):
        assert r.json()["status"] == "CANCELLED"
        assert r.json()["refundAmount"] == b["depositAmount"]  # >= 72 h before pickup
    third = await client.post(url, headers=headers)
    assert third.status_code == 200 and third.json()["refundAmount"] == b["depositAmount"]
    assert await events_of(db, events.REFUND_REQUESTED, b["bookingId"]) == 1
    assert await events_of(db, events.CANCELLED, b["bookingId"]) == 1
    await drain(container.module(Outbox).relay)
    refunds = "SELECT count(*) FROM payment WHERE booking_id = $1 AND type = 'REFUND'"
    assert await count(db, refunds, b["bookingId"]) == 1


async def test_cancellation_policy_through_http(
    client: httpx.AsyncClient, clock: OffsetClock, db: asyncpg.Connection
) -> None:
    # Customer, 30 h before pickup: 50 %.
    _, b, customer = await confirmed_booking(client, clock, start_h=30)
    r = await client.post(
        f"/api/bookings/{b['bookingId']}/cancel", headers=auth("customer", customer)
    )
    assert r.json()["refundAmount"] == b["depositAmount"] // 2
    # Customer, 10 h before: nothing, and no refund event.
    _, b, customer = await confirmed_booking(client, clock, start_h=10)
    r = await client.post(
        f"/api/bookings/{b['bookingId']}/cancel", headers=auth("customer", customer)
    )
    assert r.json()["refundAmount"] == 0
    assert await events_of(db, events.REFUND_REQUESTED, b["bookingId"]) == 0
    # Host, 10 h before: everything.
    car, b, _ = await confirmed_booking(client, clock, start_h=10)
    r = await client.post(
        f"/api/bookings/{b['bookingId']}/cancel", headers=auth("host", car["hostId"])
    )
    assert r.json()["refundAmount"] == b["depositAmount"]
    # A HOLD may be cancelled, refund 0, and frees the car at once.
    car = await make_car(client)
    customer = new_id()
    h = (await hold(client, car["id"], customer, at(50), at(60))).json()
    r = await client.post(
        f"/api/bookings/{h['bookingId']}/cancel", headers=auth("customer", customer)
    )
    assert r.status_code == 200 and r.json()["refundAmount"] == 0
    assert (await hold(client, car["id"], new_id(), at(50), at(60))).status_code == 201


async def test_trip_lifecycle_and_a_car_on_trip_keeps_blocking(
    client: httpx.AsyncClient, clock: OffsetClock, db: asyncpg.Connection
) -> None:
    car = await make_car(client)
    customer = new_id()
    host = auth("host", car["hostId"])
    h = (await hold(client, car["id"], customer, at(1), at(30))).json()
    url = f"/api/bookings/{h['bookingId']}"
    r = await client.post(f"{url}/pickup", headers=host)
    assert r.status_code == 409 and r.json()["code"] == "invalid_state"
    await webhook(client, clock, h["bookingId"], h["depositAmount"])
    r = await client.post(f"{url}/return", headers=host)
    assert r.status_code == 409 and r.json()["code"] == "invalid_state"
    r = await client.post(f"{url}/pickup", headers=host)
    assert r.status_code == 200 and r.json()["status"] == "ON_TRIP"
    assert (await hold(client, car["id"], new_id(), at(10), at(20))).status_code == 409
    r = await client.post(f"{url}/cancel", headers=auth("customer", customer))
    assert r.status_code == 409 and r.json()["code"] == "not_cancellable"
    r = await client.post(f"{url}/return", headers=ADMIN)
    assert r.status_code == 200 and r.json()["status"] == "COMPLETED"
    r = await client.post(f"{url}/return", headers=host)
    assert r.status_code == 409 and r.json()["code"] == "invalid_state"
    topics = [
        t
        for (t,) in await db.fetch(
            "SELECT topic FROM outbox WHERE payload->>'bookingId' = $1 ORDER BY id",
            str(h["bookingId"]),
        )
    ]
    assert topics == [events.HELD, events.CONFIRMED, events.PICKED_UP, events.RETURNED]


async def test_every_status_change_notifies_the_customer(
    client: httpx.AsyncClient, container: Container, clock: OffsetClock, db: asyncpg.Connection
) -> None:
    car, b, customer = await confirmed_booking(client, clock, start_h=100)
    await client.post(f"/api/bookings/{b['bookingId']}/cancel", headers=auth("customer", customer))
    await drain(container.module(Outbox).relay)
    rows = await db.fetch(
        "SELECT topic, recipient FROM notification WHERE topic LIKE 'rentals.%' "
        "AND recipient = ANY($1::bigint[]) AND status = 'SENT'",
        [customer, car["hostId"]],
    )
    got = {(r["topic"], r["recipient"]) for r in rows}
    assert {
        (events.HELD, customer),
        (events.CONFIRMED, customer),
        (events.CONFIRMED, car["hostId"]),
        (events.CANCELLED, customer),
        (events.CANCELLED, car["hostId"]),
        (events.REFUND_REQUESTED, customer),
    } <= got


async def test_search_lists_only_cars_free_for_the_whole_period(
    client: httpx.AsyncClient, clock: OffsetClock
) -> None:
    city = f"city-{new_id()}"
    free = await make_car(client, city=city, price=5_000)
    busy = await make_car(client, city=city, price=6_000)
    after = await make_car(client, city=city, price=7_000)
    await make_car(client)  # another city
    start, end = at(200), at(248)
    assert (await hold(client, busy["id"], new_id(), start + timedelta(hours=5), end)).is_success
    # Its trip ends exactly at `start`, but the buffer runs past it: still busy.
    r = await hold(client, after["id"], new_id(), start - timedelta(hours=24), start)
    assert r.is_success
    params = {"city": city, "from": start.isoformat(), "to": end.isoformat()}
    found = await client.get("/api/cars", params=params, headers=auth("customer", new_id()))
    assert found.status_code == 200
    assert found.json()["next"] is None
    assert [c["id"] for c in found.json()["items"]] == [free["id"]]
    assert found.json()["items"][0] == {
        "id": free["id"],
        "plate": free["plate"],
        "model": "Fiat Uno",
        "city": city,
        "dailyPrice": 5_000,
        "hostId": free["hostId"],
    }


# -- the sandbox payment page -------------------------------------------------------


async def test_sandbox_payment_page_confirms_through_the_signed_webhook(
    client: httpx.AsyncClient,
) -> None:
    car = await make_car(client)
    b = (await hold(client, car["id"], new_id(), at(50), at(60))).json()
    # Adapted: the link now carries its token, and the form posts it back.
    path, token = page_of(b)
    page = await client.get(path, params={"token": token})
    assert page.status_code == 200 and "<form" in page.text and "HOLD" in page.text
    assert f'<input type="hidden" name="token" value="{token}">' in page.text
    paid = await client.post(path, data={"token": token})
    assert paid.status_code == 200 and "confirmed" in paid.text and "CONFIRMED" in paid.text


async def test_sandbox_page_without_its_links_token_is_not_found_and_changes_nothing(
    client: httpx.AsyncClient, db: asyncpg.Connection
) -> None:
    car = await make_car(client)
    customer = new_id()
    b = (await hold(client, car["id"], customer, at(50), at(60))).json()
    other = (await hold(client, car["id"], new_id(), at(70), at(80))).json()
    path, token = page_of(b)
    _, other_token = page_of(other)
    assert token != other_token
    # A booking id alone is not enough: no token, a wrong one, another booking's.
    for bad in (None, "", "0" * 32, other_token, token[:-1], token + "0", token.upper()):
        params = {} if bad is None else {"token": bad}
        seen = await client.get(path, params=params)
        assert seen.status_code == 404 and seen.json()["code"] == "not_found", (bad, seen.text)
        assert "Booking" not in seen.text and str(b["depositAmount"]) not in seen.text
        paid = await client.post(path, data=params)
        assert paid.status_code == 404 and paid.json()["code"] == "not_found", (bad, paid.text)
    # The form field is the proof: the right token in the query string of a POST is not.
    paid = await client.post(path, params={"token": token})
    assert paid.status_code == 404
    # Same answer as for a booking that does not exist: the token reveals nothing.
    missing = await client.get("/sandbox/pay/999999999999", params={"token": token})
    assert (missing.status_code, missing.json()["code"]) == (404, "not_found")
    assert await db.fetchval("SELECT status FROM booking WHERE id = $1", b["bookingId"]) == "HOLD"
    payments = "SELECT count(*) FROM payment WHERE booking_id = $1"
    assert await count(db, payments, b["bookingId"]) == 0
    assert await events_of(db, events.CONFIRMED, b["bookingId"]) == 0
    seen = await client.get(f"/api/bookings/{b['bookingId']}", headers=auth("customer", customer))
    assert seen.json()["status"] == "HOLD"
    # The right token still works afterwards.
    paid = await client.post(path, data={"token": token})
    assert paid.status_code == 200 and "CONFIRMED" in paid.text
    assert await db.fetchval("SELECT status FROM booking WHERE id = $1", b["bookingId"]) == (
        "CONFIRMED"
    )


async def test_paying_twice_on_the_sandbox_page_pays_once(
    client: httpx.AsyncClient, db: asyncpg.Connection
) -> None:
    car = await make_car(client)
    twice = (await hold(client, car["id"], new_id(), at(50), at(60))).json()
    path, token = page_of(twice)
    first = await client.post(path, data={"token": token})
    assert "Gateway result: <b>confirmed</b>" in first.text
    second = await client.post(path, data={"token": token})
    assert second.status_code == 200 and "CONFIRMED" in second.text
    assert "nothing to pay" in second.text and "<form" not in second.text
    # A double submit racing: five posts released together.
    racing = (await hold(client, car["id"], new_id(), at(70), at(80))).json()
    path, token = page_of(racing)
    gate = asyncio.Event()

    async def submit() -> httpx.Response:
        await gate.wait()
        return await client.post(path, data={"token": token})

    tasks = [asyncio.create_task(submit()) for _ in range(5)]
    await asyncio.sleep(0.05)
    gate.set()
    answers = await asyncio.gather(*tasks)
    assert [r.status_code for r in answers] == [200] * 5
    assert sum("Gateway result: <b>confirmed</b>" in r.text for r in answers) == 1
    for b in (twice, racing):
        payments = "SELECT count(*) FROM payment WHERE booking_id = $1"
        assert await count(db, payments, b["bookingId"]) == 1
        assert await events_of(db, events.CONFIRMED, b["bookingId"]) == 1
        assert await events_of(db, events.REFUND_REQUESTED, b["bookingId"]) == 0
        status = await db.fetchval("SELECT status FROM booking WHERE id = $1", b["bookingId"])
        assert status == "CONFIRMED"


async def test_without_a_gateway_there_is_no_sandbox_page_and_no_payment_url(
    base_settings: Settings, clock: OffsetClock, db: asyncpg.Connection
) -> None:
    with capture_logs() as logs:
        clients = client_with(base_settings, clock, rentals_payment_gateway=None)
        client = await anext(clients)
    assert any(e["event"] == "rentals_no_gateway" and e["log_level"] == "warning" for e in logs)
    try:
        car = await make_car(client)
        customer = new_id()
        r = await hold(client, car["id"], customer, at(50), at(60))
        assert r.status_code == 201 and r.json()["status"] == "HOLD"
        assert "paymentUrl" in r.json() and r.json()["paymentUrl"] is None
        bid = r.json()["bookingId"]
        seen = await client.get(f"/api/bookings/{bid}", headers=auth("customer", customer))
        assert seen.json()["status"] == "HOLD" and seen.json()["paymentUrl"] is None
        # Not even the right token opens a page that is not served.
        token = link_token(PAY_SECRET, bid)
        assert (await client.get(f"/sandbox/pay/{bid}", params={"token": token})).status_code == (
            404
        )
        paid = await client.post(f"/sandbox/pay/{bid}", data={"token": token})
        assert paid.status_code == 404
        assert await db.fetchval("SELECT status FROM booking WHERE id = $1", bid) == "HOLD"
    finally:
        await clients.aclose()


async def test_the_sandbox_is_announced_when_it_is_on(
    base_settings: Settings, clock: OffsetClock
) -> None:
    with capture_logs() as logs:
        c = build(base_settings, clock)
    await c.close()
    assert isinstance(c.module(Rentals).gateway, SandboxGateway)
    warned = [e for e in logs if e["event"] == "rentals_sandbox_gateway"]
    assert len(warned) == 1 and warned[0]["log_level"] == "warning"
    assert "payments are simulated, do not use in production" in warned[0]["warning"]


async def test_a_refund_without_a_gateway_waits_until_one_is_configured(
    base_settings: Settings, own_database: str, clock: OffsetClock
) -> None:
    settings = base_settings.with_(database_url=own_database, rentals_payment_gateway=None)
    db = await asyncpg.connect(own_database)
    bare = build(settings, clock)
    refund_event = "SELECT status, attempts, last_error FROM outbox WHERE topic = $1"
    refunds = "SELECT count(*) FROM payment WHERE booking_id = $1 AND type = 'REFUND'"
    try:
        transport = httpx.ASGITransport(app=create_app(bare, owns_container=False))
        async with httpx.AsyncClient(transport=transport, base_url="http://reservo.test") as client:
            car = await make_car(client)
            b = (await hold(client, car["id"], new_id(), at(100), at(130))).json()
            assert (await webhook(client, clock, b["bookingId"], b["depositAmount"])).json() == {
                "result": "confirmed"
            }
            r = await client.post(
                f"/api/bookings/{b['bookingId']}/cancel", headers=auth("host", car["hostId"])
            )
            assert r.json()["refundAmount"] == b["depositAmount"]
        # One relay pass: the refund fails loudly and stays to be retried.
        with capture_logs() as logs:
            assert await bare.module(Outbox).relay.run_once() > 0
        row = await db.fetchrow(refund_event, events.REFUND_REQUESTED)
        assert (row["status"], row["attempts"]) == ("PENDING", 1)
        assert (
            "no payment gateway configured: set RESERVO_RENTALS_PAYMENT_GATEWAY"
            in (row["last_error"])
        )
        assert any(e["event"] == "rentals_refund_waiting" for e in logs)
        assert await count(db, refunds, b["bookingId"]) == 0
        # The rest of the outbox is not held up.
        others = "SELECT count(*) FROM outbox WHERE topic <> $1 AND status <> 'DONE'"
        assert await count(db, others, events.REFUND_REQUESTED) == 0
    finally:
        await bare.close()
    # The same database, now with a gateway: the waiting refund goes through, once.
    sandboxed = build(settings.with_(rentals_payment_gateway="sandbox"), clock)
    try:
        clock.advance(timedelta(seconds=5))  # past the retry's backoff
        await drain(sandboxed.module(Outbox).relay)
        await drain(sandboxed.module(Outbox).relay)
        row = await db.fetchrow(refund_event, events.REFUND_REQUESTED)
        assert row["status"] == "DONE"
        assert await count(db, refunds, b["bookingId"]) == 1
        amount = await db.fetchval(
            "SELECT amount FROM payment WHERE booking_id = $1 AND type = 'REFUND'", b["bookingId"]
        )
        assert amount == b["depositAmount"]
        assert isinstance(sandboxed.module(Rentals).gateway, SandboxGateway)
        assert [r.amount for r in sandboxed.module(Rentals).gateway.refunds.values()] == [
            b["depositAmount"]
        ]
    finally:
        await sandboxed.close()
        await db.close()
