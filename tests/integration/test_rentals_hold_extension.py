"""A HOLD extended once, through HTTP against real PostgreSQL and Redis: the new
expiry, its refusals, and the race with the expiry job at the boundary."""

from __future__ import annotations

import asyncio
from datetime import UTC, datetime, timedelta
from typing import Any

import asyncpg
import httpx

from reservo.bootstrap import Container
from reservo.core.kernel.clock import OffsetClock
from reservo.rentals import events
from reservo.rentals.setup import Rentals
from tests.helpers.auth import auth, new_id
from tests.helpers.console import signed_in
from tests.helpers.rentals import at, events_of, hold, make_car, webhook

EXTENSION = timedelta(seconds=900)  # RESERVO_RENTALS_HOLD_EXTENSION_S's default
JOBS = """
SELECT idempotency_key, status, run_at FROM scheduled_job
 WHERE category = 'rentals.expire-hold' AND (payload->>'bookingId')::bigint = $1
 ORDER BY id
"""


async def held(client: httpx.AsyncClient, start_h: float = 48) -> tuple[dict[str, Any], int]:
    car = await make_car(client)
    customer = new_id()
    r = await hold(client, car["id"], customer, at(start_h), at(start_h + 24))
    assert r.status_code == 201, r.text
    return r.json(), customer


async def extend(client: httpx.AsyncClient, booking_id: int, who: dict[str, str]) -> httpx.Response:
    return await client.post(f"/api/bookings/{booking_id}/extend-hold", headers=who)


def code_of(r: httpx.Response) -> tuple[int, str]:
    assert r.headers["content-type"].startswith("application/problem+json"), r.text
    return r.status_code, r.json()["code"]


def instant(iso: str) -> datetime:
    return datetime.fromisoformat(iso.replace("Z", "+00:00"))


async def test_extending_moves_the_expiry_once_and_replaces_the_expiry_job(
    client: httpx.AsyncClient, db: asyncpg.Connection
) -> None:
    b, customer = await held(client)
    before = instant(b["holdExpiresAt"])
    r = await extend(client, b["bookingId"], auth("customer", customer))
    assert r.status_code == 200, r.text
    out = r.json()
    assert out["status"] == "HOLD" and out["paymentUrl"]
    assert instant(out["holdExpiresAt"]) == before + EXTENSION
    # The first expiry job is cancelled; one more, due at the new expiry, replaces it.
    jobs = await db.fetch(JOBS, b["bookingId"])
    assert (jobs[0]["idempotency_key"], jobs[0]["status"]) == (
        f"booking:{b['bookingId']}",
        "CANCELLED",
    )
    assert len(jobs) == 2 and jobs[1]["status"] in {"SCHEDULED", "QUEUED"}
    assert jobs[1]["run_at"] == before + EXTENSION
    assert await events_of(db, events.HOLD_EXTENDED, b["bookingId"]) == 1
    # Once per booking: the second call changes nothing.
    again = await extend(client, b["bookingId"], auth("customer", customer))
    assert code_of(again) == (409, "hold_extended")
    row = await db.fetchrow(
        "SELECT hold_expires_at, hold_extended_at FROM booking WHERE id = $1", b["bookingId"]
    )
    assert row["hold_expires_at"] == before + EXTENSION and row["hold_extended_at"] is not None
    assert len(await db.fetch(JOBS, b["bookingId"])) == 2
    assert await events_of(db, events.HOLD_EXTENDED, b["bookingId"]) == 1


async def test_an_extended_hold_outlives_its_first_expiry_then_expires_and_blocks_nobody(
    client: httpx.AsyncClient, container: Container, clock: OffsetClock, db: asyncpg.Connection
) -> None:
    car = await make_car(client)
    customer, rival = new_id(), new_id()
    start, end = at(72), at(96)
    b = (await hold(client, car["id"], customer, start, end)).json()
    first_expiry = instant(b["holdExpiresAt"])
    job_id = await db.fetchval(
        "SELECT id FROM scheduled_job WHERE idempotency_key = $1", f"booking:{b['bookingId']}"
    )
    r = await extend(client, b["bookingId"], auth("customer", customer))
    assert r.status_code == 200, r.text
    clock.advance(timedelta(seconds=901))  # past the first expiry, before the new one
    assert first_expiry < clock.now() < first_expiry + EXTENSION
    # The first job, run anyway (a worker claimed it before the cancel), and the
    # sweeper: neither expires the extended hold.
    handler = container.scheduler.handlers["rentals.expire-hold"]
    await handler(await container.scheduler.get(job_id))
    await container.module(Rentals).service.sweep()
    seen = await client.get(f"/api/bookings/{b['bookingId']}", headers=auth("customer", customer))
    assert seen.json()["status"] == "HOLD"
    taken = await hold(client, car["id"], rival, start, end)
    assert code_of(taken) == (409, "car_unavailable")
    found = await client.get(
        "/api/cars",
        params={"city": car["city"], "from": start.isoformat(), "to": end.isoformat()},
        headers=auth("customer", rival),
    )
    assert found.json()["items"] == []
    # Past the new expiry it blocks nobody, before any job or sweeper flips it.
    clock.advance(EXTENSION)
    seen = await client.get(f"/api/bookings/{b['bookingId']}", headers=auth("customer", customer))
    assert seen.json()["status"] == "EXPIRED"
    # A token minted now: the module's ADMIN was minted at import, an hour of life
    # the clock advanced past here minutes into a long suite.
    late_admin = auth("admin", 1)
    assert code_of(await extend(client, b["bookingId"], late_admin)) == (409, "hold_expired")
    taken = await hold(client, car["id"], rival, start, end)
    assert taken.status_code == 201, taken.text
    assert await events_of(db, events.EXPIRED, b["bookingId"]) == 1


ADMIN = auth("admin", 1)


async def test_extension_refusals_change_nothing(
    client: httpx.AsyncClient, clock: OffsetClock, db: asyncpg.Connection
) -> None:
    b, customer = await held(client)
    bid = b["bookingId"]
    # Not yours: another customer and an unknown id are 404, a host's role 403.
    assert code_of(await extend(client, bid, auth("customer", new_id()))) == (
        404,
        "booking_not_found",
    )
    assert code_of(await extend(client, 9_000_000_000_000, ADMIN)) == (404, "booking_not_found")
    assert code_of(await extend(client, bid, auth("host", new_id())))[0] == 403
    # A CONFIRMED booking is no HOLD.
    paid, paid_customer = await held(client)
    w = await webhook(client, clock, paid["bookingId"], paid["depositAmount"])
    assert w.json() == {"result": "confirmed"}
    r = await extend(client, paid["bookingId"], auth("customer", paid_customer))
    assert code_of(r) == (409, "invalid_state")
    # Cancelled: no HOLD either.
    dropped, dropped_customer = await held(client)
    who = auth("customer", dropped_customer)
    assert (
        await client.post(f"/api/bookings/{dropped['bookingId']}/cancel", headers=who)
    ).is_success
    assert code_of(await extend(client, dropped["bookingId"], who)) == (409, "invalid_state")
    # Expired by the clock, not flipped yet: the UPDATE compares, and refuses.
    clock.advance(timedelta(seconds=901))
    assert await db.fetchval("SELECT status FROM booking WHERE id = $1", bid) == "HOLD"
    assert code_of(await extend(client, bid, auth("customer", customer))) == (409, "hold_expired")
    row = await db.fetchrow(
        "SELECT status, hold_expires_at, hold_extended_at FROM booking WHERE id = $1", bid
    )
    assert row["status"] == "HOLD" and row["hold_extended_at"] is None
    assert row["hold_expires_at"] == instant(b["holdExpiresAt"])
    assert await events_of(db, events.HOLD_EXTENDED, bid) == 0
    # Flipped to EXPIRED: the same answer.
    await db.execute("UPDATE booking SET status = 'EXPIRED' WHERE id = $1 AND status = 'HOLD'", bid)
    assert code_of(await extend(client, bid, ADMIN)) == (409, "hold_expired")


async def race_round(
    client: httpx.AsyncClient, container: Container, db: asyncpg.Connection, n: int
) -> list[tuple[int, datetime, httpx.Response]]:
    """``n`` holds whose expiries straddle the moment a barrier releases, for
    each, its extension (HTTP) and its expiry job, plus a sweeper. Returns
    (booking id, the expiry it had, the extension's answer) per hold."""
    handler = container.scheduler.handlers["rentals.expire-hold"]
    holds = [await held(client) for _ in range(n)]
    jobs = {}
    for b, _ in holds:
        key = f"booking:{b['bookingId']}"
        job_id = await db.fetchval("SELECT id FROM scheduled_job WHERE idempotency_key = $1", key)
        jobs[b["bookingId"]] = await container.scheduler.get(job_id)
    release = datetime.now(UTC) + timedelta(milliseconds=400)
    # Expiries from 60 ms before the release to 300 ms after it, 15 ms apart.
    expiry = {
        b["bookingId"]: release + timedelta(milliseconds=-60 + 15 * i)
        for i, (b, _) in enumerate(holds)
    }
    await db.executemany(
        "UPDATE booking SET hold_expires_at = $2 WHERE id = $1", list(expiry.items())
    )
    gate = asyncio.Event()

    async def extension(booking_id: int, customer: int) -> httpx.Response:
        await gate.wait()
        return await extend(client, booking_id, auth("customer", customer))

    async def expiry_job(booking_id: int) -> None:
        await gate.wait()
        await handler(jobs[booking_id])

    async def sweeper() -> None:
        await gate.wait()
        await container.module(Rentals).service.sweep()

    answers = [asyncio.create_task(extension(b["bookingId"], c)) for b, c in holds]
    others = [asyncio.create_task(expiry_job(b["bookingId"])) for b, _ in holds]
    others.append(asyncio.create_task(sweeper()))
    await asyncio.sleep(max(0.0, (release - datetime.now(UTC)).total_seconds()))
    gate.set()
    responses = await asyncio.gather(*answers)
    await asyncio.gather(*others)
    # A hold whose job ran a moment before its expiry is flipped by the next
    # sweep (the safety net); an extended one is 900 s away from it.
    await container.module(Rentals).service.sweep()
    return [
        (b["bookingId"], expiry[b["bookingId"]], r)
        for (b, _), r in zip(holds, responses, strict=True)
    ]


async def test_extension_and_expiry_racing_at_the_boundary_end_in_one_state(
    client: httpx.AsyncClient, container: Container, db: asyncpg.Connection
) -> None:
    """Every hold ends either extended and alive or expired and not extended,
    never both, never neither, whichever statement took the row first."""
    outcomes: dict[str, int] = {"extended": 0, "expired": 0}
    for _ in range(4):
        for bid, was, r in await race_round(client, container, db, 25):
            row = await db.fetchrow(
                "SELECT status, hold_expires_at, hold_extended_at FROM booking WHERE id = $1", bid
            )
            if r.status_code == 200:
                outcomes["extended"] += 1
                assert row["status"] == "HOLD", bid
                assert row["hold_extended_at"] is not None
                assert row["hold_expires_at"] == was + EXTENSION
                assert await events_of(db, events.EXPIRED, bid) == 0
            else:
                outcomes["expired"] += 1
                assert code_of(r) == (409, "hold_expired"), r.text
                assert row["status"] == "EXPIRED", bid
                assert row["hold_extended_at"] is None
                assert row["hold_expires_at"] == was
                assert await events_of(db, events.EXPIRED, bid) == 1
            assert await events_of(db, events.HOLD_EXTENDED, bid) == (r.status_code == 200)
    # Both sides won somewhere: the boundary was really crossed.
    assert outcomes["extended"] > 0 and outcomes["expired"] > 0, outcomes


async def test_the_console_shows_a_holds_extension_on_the_customers_bookings(
    client: httpx.AsyncClient,
) -> None:
    b, customer = await held(client)
    plain, _ = await held(client)
    r = await extend(client, b["bookingId"], ADMIN)
    assert r.status_code == 200, r.text
    await signed_in(client)
    page = await client.get("/console/rentals/bookings", params={"customer": customer})
    assert page.status_code == 200
    until = instant(r.json()["holdExpiresAt"]).strftime("%Y-%m-%d %H:%M")
    assert f"until {until}" in page.text and "extended " in page.text
    assert page.text.count('class="hold-extended"') == 1
    other = await client.get("/console/rentals/bookings", params={"customer": plain["customerId"]})
    assert other.status_code == 200 and 'class="hold-extended"' not in other.text
