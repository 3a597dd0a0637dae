"""Prepaid appointments (the appointments note's HELD state) through HTTP against
real PostgreSQL and Redis: a held seat counts, the signed webhook confirms it
once, a short, late or excess payment goes back once through the outbox, an
unpaid hold ends (EXPIRED, seat freed once) by its job, by the sweeper or by the
next booking, and a cancel frees it. The races are real concurrent clients
released together; the invariants are read from the database afterwards."""

from __future__ import annotations

import asyncio
import re
import uuid
from collections import Counter
from datetime import UTC, datetime, timedelta
from typing import Any
from urllib.parse import parse_qs, urlsplit

import asyncpg
import httpx
import icalendar
import orjson

from reservo.appointments import events
from reservo.appointments.gate import full_key
from reservo.appointments.holds import EXPIRE_HOLD, expiry_key
from reservo.appointments.setup import Appointments
from reservo.bootstrap import Container
from reservo.core.kernel.clock import OffsetClock
from reservo.settings import Settings
from tests.helpers.appointments import book, make_slots, wait
from tests.helpers.auth import ADMIN, auth, new_id
from tests.helpers.console import signed_in
from tests.helpers.prepaid import (
    PRICE,
    events_of,
    pay,
    prepaid_slots,
    refunded,
    seat_counts,
    signed,
)
from tests.helpers.scheduler import api_stack, running

HOLD = timedelta(minutes=15)  # holdMinutes' default


def instant(iso: str) -> datetime:
    return datetime.fromisoformat(iso.replace("Z", "+00:00"))


def code_of(r: httpx.Response) -> tuple[int, str]:
    assert r.headers["content-type"].startswith("application/problem+json"), r.text
    return r.status_code, r.json()["code"]


async def held(client: httpx.AsyncClient, slot_id: int) -> tuple[dict[str, Any], int]:
    patient = new_id()
    r = await book(client, slot_id, patient)
    assert r.status_code == 201, r.text
    assert r.json()["status"] == "HELD", r.text
    return r.json(), patient


async def get(client: httpx.AsyncClient, appointment_id: int, patient: int) -> dict[str, Any]:
    r = await client.get(f"/api/appointments/{appointment_id}", headers=auth("patient", patient))
    assert r.status_code == 200, r.text
    found: dict[str, Any] = r.json()
    return found


async def jobs_of(db: asyncpg.Connection, appointment_id: int) -> list[str]:
    rows = await db.fetch(
        "SELECT status FROM scheduled_job WHERE category = $1 AND idempotency_key = $2",
        EXPIRE_HOLD,
        expiry_key(appointment_id),
    )
    return [r["status"] for r in rows]


# -- a hold, its payment ------------------------------------------------------------------


async def test_a_prepaid_slot_is_held_counted_and_confirmed_once_by_its_payment(
    client: httpx.AsyncClient, container: Container, db: asyncpg.Connection, clock: OffsetClock
) -> None:
    _, slots = await prepaid_slots(client)
    slot = slots[0]["id"]
    before = clock.now()
    a, patient = await held(client, slot)
    assert a["price"] == {"amount": PRICE, "currency": "EUR"}
    end = instant(a["holdExpiresAt"])
    assert before + HOLD <= end <= clock.now() + HOLD
    url = urlsplit(a["paymentUrl"])  # the sandbox gateway's page for appointments
    assert url.path == f"/sandbox/pay-appointment/{a['id']}", a["paymentUrl"]
    assert a["overpaidRefund"] is None
    # The held seat counts: the slot is full for everyone else.
    assert await seat_counts(db, slot) == (1, 1, 0)
    assert code_of(await book(client, slot, new_id())) == (409, "slot_full")
    assert await events_of(db, events.HELD, a["id"]) == 1
    assert await jobs_of(db, a["id"]) == ["SCHEDULED"]
    r = await pay(client, clock, a["id"], PRICE, txn="txn-once")
    assert r.status_code == 200 and r.json() == {"result": "confirmed"}, r.text
    seen = await get(client, a["id"], patient)
    assert (seen["status"], seen["overpaidRefund"], seen["paymentUrl"]) == ("BOOKED", 0, None)
    # A redelivery changes nothing, refunds nothing.
    again = await pay(client, clock, a["id"], PRICE, txn="txn-once")
    assert again.json() == {"result": "duplicate"}
    assert await seat_counts(db, slot) == (1, 0, 1)
    assert await events_of(db, events.CONFIRMED, a["id"]) == 1
    assert await events_of(db, events.REFUND_REQUESTED, a["id"]) == 0
    # Nothing left to expire: the job went with the hold; even run, it changes nothing.
    assert await jobs_of(db, a["id"]) == ["CANCELLED"]
    clock.advance(HOLD + timedelta(minutes=1))
    assert await container.module(Appointments).service.expire_hold(a["id"]) is False
    assert (await get(client, a["id"], patient))["status"] == "BOOKED"


async def test_the_sandbox_page_pays_a_hold_through_the_signed_webhook(
    client: httpx.AsyncClient, db: asyncpg.Connection
) -> None:
    _, slots = await prepaid_slots(client)
    a, patient = await held(client, slots[0]["id"])
    url = urlsplit(a["paymentUrl"])
    token = parse_qs(url.query)["token"][0]
    page = await client.get(url.path, params={"token": token})
    assert page.status_code == 200 and f"Pay {PRICE}" in page.text
    # Another appointment's token (or a booking's of the same id) opens nothing.
    assert (await client.get(url.path, params={"token": "0" * 32})).status_code == 404
    paid = await client.post(url.path, data={"token": token})
    assert paid.status_code == 200 and "confirmed" in paid.text, paid.text
    twice = await client.post(url.path, data={"token": token})
    assert "nothing to pay" in twice.text
    assert (await get(client, a["id"], patient))["status"] == "BOOKED"
    assert await events_of(db, events.CONFIRMED, a["id"]) == 1


async def test_the_webhook_names_exactly_one_target_and_refusals_change_nothing(
    client: httpx.AsyncClient, db: asyncpg.Connection, clock: OffsetClock
) -> None:
    _, slots = await prepaid_slots(client)
    a, patient = await held(client, slots[0]["id"])
    bodies = [
        {"appointmentId": a["id"], "bookingId": 1},  # both
        {},  # neither
    ]
    for target in bodies:
        raw, sig = signed(
            {**target, "providerTxnId": "t-x", "amount": PRICE, "status": "SUCCEEDED"}, clock
        )
        r = await client.post(
            "/api/payments/webhook",
            content=raw,
            headers={"X-Signature": sig, "Content-Type": "application/json"},
        )
        assert code_of(r) == (422, "validation_error"), (target, r.text)
    assert code_of(await pay(client, clock, 2**62, PRICE)) == (404, "appointment_not_found")
    # An appointment booked at once was never held: nothing was due.
    _, plain = await make_slots(client)
    booked = await book(client, plain[0]["id"], new_id())
    assert booked.json()["status"] == "BOOKED" and "price" not in booked.json()
    assert code_of(await pay(client, clock, booked.json()["id"], PRICE)) == (409, "not_held")
    n = await db.fetchval(
        "SELECT count(*) FROM appointment_payment WHERE appointment_id = ANY($1::bigint[])",
        [a["id"], booked.json()["id"]],
    )
    assert n == 0
    assert (await get(client, a["id"], patient))["status"] == "HELD"


# -- payments that do not match the price --------------------------------------------------


async def test_a_short_payment_is_refunded_in_full_and_the_hold_stays(
    client: httpx.AsyncClient, container: Container, db: asyncpg.Connection, clock: OffsetClock
) -> None:
    _, slots = await prepaid_slots(client)
    a, patient = await held(client, slots[0]["id"])
    r = await pay(client, clock, a["id"], PRICE - 1)
    assert r.json() == {"result": "refund_requested"}, r.text
    assert (await get(client, a["id"], patient))["status"] == "HELD"
    assert await refunded(container, db, a["id"]) == [PRICE - 1]
    # Paid in full afterwards: confirmed, and the short payment is not refunded twice.
    assert (await pay(client, clock, a["id"], PRICE)).json() == {"result": "confirmed"}
    assert await refunded(container, db, a["id"]) == [PRICE - 1]
    outcomes = await db.fetch(
        "SELECT outcome, refund_due FROM appointment_payment WHERE appointment_id = $1 "
        "AND type = 'PAYMENT' ORDER BY id",
        a["id"],
    )
    assert [(o["outcome"], o["refund_due"]) for o in outcomes] == [
        ("underpaid", PRICE - 1),
        ("confirmed", 0),
    ]


async def test_an_overpayment_confirms_and_returns_the_excess_once(
    client: httpx.AsyncClient, container: Container, db: asyncpg.Connection, clock: OffsetClock
) -> None:
    _, slots = await prepaid_slots(client)
    a, patient = await held(client, slots[0]["id"])
    r = await pay(client, clock, a["id"], PRICE + 700, txn="txn-over")
    assert r.json() == {"result": "overpaid"}, r.text
    seen = await get(client, a["id"], patient)
    assert (seen["status"], seen["overpaidRefund"]) == ("BOOKED", 700)
    listed = await client.get(
        f"/api/patients/{patient}/appointments", headers=auth("patient", patient)
    )
    assert [i["overpaidRefund"] for i in listed.json()["items"]] == [700]
    assert (await pay(client, clock, a["id"], PRICE + 700, txn="txn-over")).json() == {
        "result": "duplicate"
    }
    assert await refunded(container, db, a["id"]) == [700]
    confirmed = await db.fetchval(
        "SELECT payload::text FROM outbox WHERE topic = $1 AND payload->>'appointmentId' = $2",
        events.CONFIRMED,
        str(a["id"]),
    )
    assert orjson.loads(confirmed)["overpaidRefund"] == 700


async def test_a_payment_after_the_hold_ended_is_refunded_and_frees_the_seat_once(
    client: httpx.AsyncClient, container: Container, db: asyncpg.Connection, clock: OffsetClock
) -> None:
    _, slots = await prepaid_slots(client)
    slot = slots[0]["id"]
    a, patient = await held(client, slot)
    clock.advance(HOLD + timedelta(seconds=1))  # no job, no sweeper has run
    assert (await get(client, a["id"], patient))["status"] == "EXPIRED"  # read as ended
    r = await pay(client, clock, a["id"], PRICE)
    assert r.json() == {"result": "refund_requested"}, r.text
    assert await db.fetchval("SELECT status FROM appointment WHERE id = $1", a["id"]) == "EXPIRED"
    assert await seat_counts(db, slot) == (0, 0, 0)
    # The job that comes later, the sweeper and a second late payment free nothing more.
    assert await container.module(Appointments).service.expire_hold(a["id"]) is False
    await container.module(Appointments).service.sweep_holds()
    assert (await pay(client, clock, a["id"], PRICE)).json() == {"result": "refund_requested"}
    assert await seat_counts(db, slot) == (0, 0, 0)
    assert await events_of(db, events.EXPIRED, a["id"]) == 1
    assert await refunded(container, db, a["id"]) == [PRICE, PRICE]
    assert (await book(client, slot, new_id())).status_code == 201  # bookable again
    # The patient was told each step, once per event.
    told = await db.fetch(
        "SELECT topic, subject FROM notification WHERE recipient = $1 ORDER BY created_at, id",
        patient,
    )
    assert [r["topic"] for r in told] == [
        events.HELD,
        events.EXPIRED,
        events.REFUND_REQUESTED,
        events.REFUND_REQUESTED,
    ]
    assert told[0]["subject"].startswith("Pay to confirm your appointment")
    assert told[2]["subject"] == f"Refund of {PRICE} EUR for your appointment at " + (
        datetime.fromisoformat(a["startAt"]).strftime("%Y-%m-%d %H:%M UTC")
    )


# -- the end of a hold: never blocking past it ------------------------------------------------


async def test_an_ended_hold_blocks_no_seat_before_any_job_and_the_gate_never_outlives_it(
    client: httpx.AsyncClient, container: Container, db: asyncpg.Connection
) -> None:
    """The gate's full mark set by a refusal lives no longer than the slot's
    earliest hold: once that hold is over, the next booking reaches the
    database, which flips the hold EXPIRED and gives its seat, with no job or
    sweeper run. Real time: Redis TTLs follow the wall clock."""
    doctor, slots = await prepaid_slots(client, hold_minutes=1)
    slot = slots[0]["id"]
    a, _ = await held(client, slot)
    # The hold has 3 s left; the mark of its booking is dropped (a mark set at the
    # booking lives full_mark_ttl_s = 30 s < any hold, the minimum being 1 min).
    ends = datetime.now(UTC) + timedelta(seconds=3)
    await db.execute("UPDATE appointment SET hold_expires_at = $2 WHERE id = $1", a["id"], ends)
    await container.cache.clear_mark(full_key(slot))
    assert code_of(await book(client, slot, new_id())) == (409, "slot_full")  # by the database
    ttl_ms = await container.cache.gate.client.pttl(container.cache.mark_key(full_key(slot)))
    assert 0 < ttl_ms <= 3000, ttl_ms
    await asyncio.sleep(max(0.0, (ends - datetime.now(UTC)).total_seconds()) + 0.2)
    day = slots[0]["startAt"][:10]
    shown = await client.get(f"/api/doctors/{doctor}/slots", params={"date": day}, headers=ADMIN)
    (listed,) = [s for s in shown.json() if s["id"] == slot]
    assert (listed["available"], listed["bookedCount"]) == (1, 0)  # counted free already
    second, _ = await held(client, slot)  # neither Redis nor the database refuses
    assert await db.fetchval("SELECT status FROM appointment WHERE id = $1", a["id"]) == "EXPIRED"
    assert await events_of(db, events.EXPIRED, a["id"]) == 1
    assert await seat_counts(db, slot) == (1, 1, 0)
    assert second["id"] != a["id"]


async def test_cancelling_a_hold_frees_its_seat_and_an_ended_one_is_not_held(
    client: httpx.AsyncClient, db: asyncpg.Connection, clock: OffsetClock
) -> None:
    _, slots = await prepaid_slots(client)
    slot = slots[0]["id"]
    a, patient = await held(client, slot)
    assert code_of(await book(client, slot, new_id())) == (409, "slot_full")  # marks it full
    for _ in range(2):  # twice: 200 both times, the seat freed once
        c = await client.delete(f"/api/appointments/{a['id']}", headers=auth("patient", patient))
        assert c.status_code == 200 and c.json()["status"] == "CANCELLED", c.text
    assert await seat_counts(db, slot) == (0, 0, 0)
    assert await jobs_of(db, a["id"]) == ["CANCELLED"]
    # The cancel cleared the gate's mark: the seat is bookable at once.
    b, other = await held(client, slot)
    # A hold that ended is EXPIRED: not cancellable, its seat freed once.
    clock.advance(HOLD + timedelta(seconds=1))
    admin_cancel = await client.delete(f"/api/appointments/{b['id']}", headers=ADMIN)
    assert code_of(admin_cancel) == (409, "not_held")
    assert await db.fetchval("SELECT status FROM appointment WHERE id = $1", b["id"]) == "EXPIRED"
    assert await seat_counts(db, slot) == (0, 0, 0)
    # The payment that comes then confirms nothing.
    assert (await pay(client, clock, b["id"], PRICE)).json() == {"result": "refund_requested"}
    assert (await get(client, b["id"], other))["status"] == "EXPIRED"


async def test_a_seat_freed_on_a_prepaid_slot_is_held_for_the_waiting_patient(
    client: httpx.AsyncClient, db: asyncpg.Connection, clock: OffsetClock
) -> None:
    """The waitlist gets a hold, not a free booking: the waiting patient pays
    like anyone else, and the hold has its expiry job."""
    _, slots = await prepaid_slots(client)
    slot = slots[0]["id"]
    a, patient = await held(client, slot)
    waiting = new_id()
    assert (await wait(client, slot, waiting)).status_code == 201
    c = await client.delete(f"/api/appointments/{a['id']}", headers=auth("patient", patient))
    assert c.status_code == 200
    given = await db.fetchrow(
        "SELECT id, status, price_amount FROM appointment WHERE slot_id = $1 AND patient_id = $2",
        slot,
        waiting,
    )
    assert (given["status"], given["price_amount"]) == ("HELD", PRICE)
    assert await seat_counts(db, slot) == (1, 1, 0)
    assert await events_of(db, events.HELD, given["id"]) == 1
    assert await jobs_of(db, given["id"]) == ["SCHEDULED"]
    assert (await pay(client, clock, given["id"], PRICE)).json() == {"result": "confirmed"}
    assert await seat_counts(db, slot) == (1, 0, 1)


async def test_moving_a_booking_into_a_prepaid_slot_holds_it_until_paid(
    client: httpx.AsyncClient, db: asyncpg.Connection
) -> None:
    _, plain = await make_slots(client, days_ahead=3)
    _, slots = await prepaid_slots(client)
    patient = new_id()
    old = (await book(client, plain[0]["id"], patient)).json()
    r = await client.post(
        f"/api/appointments/{old['id']}/reschedule",
        json={"slotId": slots[0]["id"]},
        headers={**auth("patient", patient), "Idempotency-Key": str(uuid.uuid4())},
    )
    assert r.status_code == 200, r.text
    moved = r.json()
    assert (moved["status"], moved["rescheduledFrom"]) == ("HELD", old["id"])
    assert urlsplit(moved["paymentUrl"]).path == f"/sandbox/pay-appointment/{moved['id']}"
    assert await events_of(db, events.HELD, moved["id"]) == 1
    assert await jobs_of(db, moved["id"]) == ["SCHEDULED"]
    assert await seat_counts(db, slots[0]["id"]) == (1, 1, 0)


async def test_lists_agenda_and_calendar_show_held_and_expired(
    client: httpx.AsyncClient, container: Container, clock: OffsetClock
) -> None:
    doctor, slots = await prepaid_slots(client)
    a, patient = await held(client, slots[0]["id"])
    who = auth("patient", patient)
    r = await client.post(f"/api/patients/{patient}/calendar-link", headers=who)
    feed = urlsplit(r.json()["url"]).path

    async def statuses() -> tuple[str, str, str, str]:
        listed = await client.get(f"/api/patients/{patient}/appointments", headers=who)
        day = slots[0]["startAt"][:10]
        agenda = await client.get(
            f"/api/doctors/{doctor}/agenda", params={"date": day}, headers=ADMIN
        )
        (entry,) = [x for s in agenda.json()["slots"] for x in s["appointments"]]
        cal = icalendar.Calendar.from_ical((await client.get(feed)).content)
        (event,) = list(cal.walk("VEVENT"))
        (item,) = listed.json()["items"]
        return item["status"], entry["status"], str(event["STATUS"]), item["paymentUrl"] or ""

    listed, agenda, ics, url = await statuses()
    assert (listed, agenda, ics) == ("HELD", "HELD", "TENTATIVE") and url
    filtered = await client.get(
        f"/api/patients/{patient}/appointments", params={"status": "HELD"}, headers=who
    )
    assert [i["id"] for i in filtered.json()["items"]] == [a["id"]]
    clock.advance(HOLD + timedelta(seconds=1))
    await container.module(
        Appointments
    ).service.sweep_holds()  # flipped, and the feed's cache dropped
    assert await statuses() == ("EXPIRED", "EXPIRED", "CANCELLED", "")
    filtered = await client.get(
        f"/api/patients/{patient}/appointments", params={"status": "EXPIRED"}, headers=who
    )
    assert [i["id"] for i in filtered.json()["items"]] == [a["id"]]


async def test_the_console_shows_a_hold_and_cancels_it(
    client: httpx.AsyncClient, db: asyncpg.Connection
) -> None:
    doctor, slots = await prepaid_slots(client)
    slot = slots[0]["id"]
    a, patient = await held(client, slot)
    csrf = await signed_in(client)
    day = slots[0]["startAt"][:10]
    agenda = await client.get("/console/clinic", params={"doctor": doctor, "day": day})
    row = re.search(rf'<tr id="appointment-{a["id"]}">.*?</tr>', agenda.text, re.S)
    assert row is not None and "HELD" in row[0] and "Cancel" in row[0], agenda.text
    page = await client.get("/console/clinic/appointments", params={"patient": patient})
    assert "HELD" in page.text and "unpaid until" in page.text
    r = await client.post(
        f"/console/clinic/appointments/{a['id']}/cancel", data={"csrf": csrf, "day": day}
    )
    assert r.status_code == 303, r.text
    assert await seat_counts(db, slot) == (0, 0, 0)


# -- races against the real database ---------------------------------------------------------


async def test_fifty_patients_racing_for_the_last_prepaid_seat_get_one_hold(
    client: httpx.AsyncClient, db: asyncpg.Connection
) -> None:
    _, slots = await prepaid_slots(client, capacity=3)
    slot = slots[0]["id"]
    for _ in range(2):
        await held(client, slot)
    gate = asyncio.Event()

    async def attempt() -> httpx.Response:
        await gate.wait()
        return await book(client, slot, new_id())

    tasks = [asyncio.create_task(attempt()) for _ in range(50)]
    await asyncio.sleep(0.1)
    gate.set()
    answers = await asyncio.gather(*tasks)
    got = Counter(r.status_code if r.status_code == 201 else code_of(r)[1] for r in answers)
    assert got == {201: 1, "slot_full": 49}, got
    assert [r.json()["status"] for r in answers if r.status_code == 201] == ["HELD"]
    assert await seat_counts(db, slot) == (3, 3, 0)


async def test_a_payment_racing_the_expiry_ends_in_one_outcome_and_frees_the_seat_once(
    client: httpx.AsyncClient, container: Container, db: asyncpg.Connection, clock: OffsetClock
) -> None:
    """Holds whose ends straddle the moment a barrier releases, each paid (the
    signed webhook) while its expiry job and a sweeper run: every one ends BOOKED
    (confirmed, nothing refunded) or EXPIRED (the payment refunded in full), and
    the slot's counter equals its live seats."""
    _, slots = await prepaid_slots(client, capacity=30)
    slot = slots[0]["id"]
    holds = [await held(client, slot) for _ in range(30)]
    handler = container.scheduler.handlers[EXPIRE_HOLD]
    jobs = {}
    for a, _ in holds:
        job_id = await db.fetchval(
            "SELECT id FROM scheduled_job WHERE category = $1 AND idempotency_key = $2",
            EXPIRE_HOLD,
            expiry_key(a["id"]),
        )
        jobs[a["id"]] = await container.scheduler.get(job_id)
    release = clock.now() + timedelta(milliseconds=400)
    ends = {
        a["id"]: release + timedelta(milliseconds=-100 + 50 * i) for i, (a, _) in enumerate(holds)
    }
    await db.executemany(
        "UPDATE appointment SET hold_expires_at = $2 WHERE id = $1", list(ends.items())
    )
    gate = asyncio.Event()

    async def payment(appointment_id: int) -> httpx.Response:
        await gate.wait()
        return await pay(client, clock, appointment_id, PRICE)

    async def expiry(appointment_id: int) -> None:
        await gate.wait()
        await handler(jobs[appointment_id])

    async def sweeper() -> None:
        await gate.wait()
        await container.module(Appointments).service.sweep_holds()

    answers = [asyncio.create_task(payment(a["id"])) for a, _ in holds]
    others = [asyncio.create_task(expiry(a["id"])) for a, _ in holds]
    others.append(asyncio.create_task(sweeper()))
    await asyncio.sleep(max(0.0, (release - clock.now()).total_seconds()))
    gate.set()
    results = await asyncio.gather(*answers)
    await asyncio.gather(*others)
    await container.module(Appointments).service.sweep_holds()  # a job that ran early
    outcomes: Counter[str] = Counter()
    for (a, _), r in zip(holds, results, strict=True):
        status = await db.fetchval("SELECT status FROM appointment WHERE id = $1", a["id"])
        result = r.json()["result"]
        outcomes[status] += 1
        if status == "BOOKED":
            assert result == "confirmed", (a["id"], result)
            assert await events_of(db, events.EXPIRED, a["id"]) == 0
            assert await events_of(db, events.REFUND_REQUESTED, a["id"]) == 0
        else:
            assert (status, result) == ("EXPIRED", "refund_requested"), (a["id"], status)
            assert await events_of(db, events.EXPIRED, a["id"]) == 1
            assert await events_of(db, events.CONFIRMED, a["id"]) == 0
            assert await refunded(container, db, a["id"]) == [PRICE]
    counter, live_held, booked = await seat_counts(db, slot)
    assert live_held == 0 and counter == booked == outcomes["BOOKED"], outcomes
    assert outcomes["BOOKED"] > 0 and outcomes["EXPIRED"] > 0, outcomes  # both sides won


# -- the expiry survives a restart of every process ---------------------------------------------


async def test_a_hold_expires_after_every_process_restarted_and_redis_lost_its_keys(
    base_settings: Settings, own_database: str
) -> None:
    """A hold taken by one stack (API, scheduler, its Redis namespace) that then
    goes away entirely; a new stack on the same database with an empty Redis
    namespace expires it from its durable job alone (no sweeper runs)."""
    async with api_stack(base_settings, own_database) as first:
        _, slots = await prepaid_slots(first.client, hold_minutes=1)
        slot = slots[0]["id"]
        a, patient = await held(first.client, slot)
    async with api_stack(base_settings, own_database) as second:
        # The hold's end comes 2 s from now (its durable job moved with it).
        ends = datetime.now(UTC) + timedelta(seconds=2)
        await second.db.execute(
            "UPDATE appointment SET hold_expires_at = $2 WHERE id = $1", a["id"], ends
        )
        await second.db.execute(
            "UPDATE scheduled_job SET run_at = $3 WHERE category = $1 AND idempotency_key = $2",
            EXPIRE_HOLD,
            expiry_key(a["id"]),
            ends,
        )
        async with running(second.container.scheduler):
            for _ in range(150):
                status = await second.db.fetchval(
                    "SELECT status FROM appointment WHERE id = $1", a["id"]
                )
                if status == "EXPIRED":
                    break
                await asyncio.sleep(0.1)
        assert status == "EXPIRED"
        assert await seat_counts(second.db, slot) == (0, 0, 0)
        assert await jobs_of(second.db, a["id"]) == ["DONE"]
        assert await events_of(second.db, events.EXPIRED, a["id"]) == 1
        again = await book(second.client, slot, patient, str(uuid.uuid4()))
        assert again.status_code == 201 and again.json()["status"] == "HELD"
