"""Issue 38 item 4: what a request says twice is refused, never guessed, on both
paths (hot routes dispatched in front of the middleware stack, and through it).

- A JSON body naming one key twice in one object, at any depth, is 422
  `duplicate_key` and changes nothing: `{"amount": 1, "amount": 100000000}` moved
  100,000,000 (orjson keeps the last value). The signed webhooks read their body
  raw, whatever its Content-Type: they refuse it too, after the signature.
- A request with more than one `Idempotency-Key` header is 400
  `idempotency_key_required`: the first key was used, and a retry under the
  second moved the money again."""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator
from datetime import timedelta
from typing import Any

import asyncpg
import httpx
import pytest

from reservo.app import create_app
from reservo.bootstrap import Container, build
from reservo.core.http.auth import sign_webhook
from reservo.core.kernel.clock import OffsetClock
from reservo.settings import Settings
from tests.helpers.appointments import make_slots
from tests.helpers.auth import PAY_SECRET, RESULTS_SECRET, SERVICE, auth, new_id
from tests.helpers.betting import balance, kick_off, make_account, make_match
from tests.helpers.http import problem
from tests.helpers.rentals import at, hold, make_car

JSON = {"Content-Type": "application/json"}


@pytest.fixture(params=[True, False], ids=["front", "stack"])
async def app(
    request: pytest.FixtureRequest, base_settings: Settings
) -> AsyncIterator[tuple[httpx.AsyncClient, Container]]:
    container = build(base_settings.with_(lean_paths=request.param), OffsetClock())
    transport = httpx.ASGITransport(app=create_app(container))
    async with httpx.AsyncClient(transport=transport, base_url="http://reservo.test") as c:
        yield c, container
    await container.close()


def duplicate_key(r: httpx.Response, key: str) -> None:
    body = problem(r, 422, "duplicate_key")
    assert body["errors"][0]["loc"] == ["body"] and repr(key) in body["errors"][0]["msg"], body


async def movements(db: asyncpg.Connection, *accounts: int) -> int:
    return int(
        await db.fetchval("SELECT count(*) FROM wallet_entry WHERE account_id = ANY($1)", accounts)
    )


# -- a key twice in one JSON object -----------------------------------------------------------


async def test_a_transfer_naming_amount_twice_is_422_and_moves_nothing(
    app: tuple[httpx.AsyncClient, Container], db: asyncpg.Connection
) -> None:
    client, _ = app
    a, owner = await make_account(client, 100_000_000)
    b, _ = await make_account(client, 0)
    before = await movements(db, a, b)
    raw = f'{{"fromAccountId":{a},"toAccountId":{b},"amount":1,"amount":100000000}}'
    spaced = f'{{"fromAccountId": {a}, "amount" : 1, "toAccountId": {b}, "amount": 100000000}}'
    for body in (raw, spaced):
        r = await client.post(
            "/api/transfers",
            content=body,
            headers={**auth("bettor", owner), **JSON, "Idempotency-Key": str(uuid.uuid4())},
        )
        duplicate_key(r, "amount")
    assert (await balance(client, a), await balance(client, b)) == (100_000_000, 0)
    assert await movements(db, a, b) == before
    # The same transfer said once is served.
    ok = await client.post(
        "/api/transfers",
        content=f'{{"fromAccountId":{a},"toAccountId":{b},"amount":1}}',
        headers={**auth("bettor", owner), **JSON, "Idempotency-Key": str(uuid.uuid4())},
    )
    assert ok.status_code == 201, ok.text
    assert (await balance(client, a), await balance(client, b)) == (99_999_999, 1)


async def test_a_deposit_naming_amount_twice_is_422_and_moves_nothing(
    app: tuple[httpx.AsyncClient, Container], db: asyncpg.Connection
) -> None:
    client, _ = app
    a, _ = await make_account(client, 0)
    before = await movements(db, a)
    r = await client.post(
        f"/api/accounts/{a}/deposits",
        content=b'{"amount":1,"reference":"dep-twice","amount":100000000}',
        headers={**SERVICE, **JSON, "Idempotency-Key": str(uuid.uuid4())},
    )
    duplicate_key(r, "amount")
    assert await balance(client, a) == 0 and await movements(db, a) == before


async def test_a_key_twice_at_any_depth_is_422(
    app: tuple[httpx.AsyncClient, Container], db: asyncpg.Connection
) -> None:
    """Deep inside a free-form payload, and inside an array: the same refusal."""
    client, _ = app
    jobs = await db.fetchval("SELECT count(*) FROM scheduled_job")
    run_at = (at(48)).isoformat()
    for payload in (
        '{"url":"https://example.com/a","url":"https://example.com/b"}',
        '{"url":"https://example.com/a","body":{"x":[{"y":1},{"y":1,"z":{"y":2,"y":3}}]}}',
    ):
        body = f'{{"category":"http","runAt":"{run_at}","payload":{payload}}}'
        r = await client.post("/api/jobs", content=body, headers={**SERVICE, **JSON})
        duplicate_key(r, "url" if payload.count('"url"') == 2 else "y")
    assert await db.fetchval("SELECT count(*) FROM scheduled_job") == jobs


async def test_a_booking_naming_slot_id_twice_is_422_and_books_nothing(
    app: tuple[httpx.AsyncClient, Container], db: asyncpg.Connection
) -> None:
    client, _ = app
    _, slots = await make_slots(client, capacity=2)
    first, other = slots[0]["id"], slots[1]["id"]
    patient = new_id()
    r = await client.post(
        "/api/appointments",
        content=f'{{"slotId":{first},"patientId":{patient},"slotId":{other}}}',
        headers={**auth("patient", patient), **JSON, "Idempotency-Key": str(uuid.uuid4())},
    )
    duplicate_key(r, "slotId")
    n = await db.fetchval("SELECT count(*) FROM appointment WHERE patient_id = $1", patient)
    booked = await db.fetchval(
        "SELECT sum(booked_count) FROM time_slot WHERE id = ANY($1)", [first, other]
    )
    assert (n, booked) == (0, 0)


@pytest.mark.parametrize("content_type", [JSON, {}], ids=["json", "no-content-type"])
async def test_a_signed_payment_webhook_naming_amount_twice_is_422_and_pays_nothing(
    app: tuple[httpx.AsyncClient, Container],
    db: asyncpg.Connection,
    content_type: dict[str, str],
) -> None:
    """Without a JSON Content-Type no middleware reads the body: the webhook's own
    reading refuses it, after the signature is checked."""
    client, container = app
    clock = container.clock
    assert isinstance(clock, OffsetClock)
    car = await make_car(client)
    customer = new_id()
    held = await hold(client, car["id"], customer, at(48), at(72))
    assert held.status_code == 201, held.text
    booking = held.json()
    txn = f"txn-{uuid.uuid4().hex}"
    raw = (
        f'{{"bookingId":{booking["bookingId"]},"providerTxnId":"{txn}","amount":1,'
        f'"status":"SUCCEEDED","amount":{booking["depositAmount"]}}}'
    ).encode()
    signature = sign_webhook(PAY_SECRET, raw, int(clock.now().timestamp()))
    r = await client.post(
        "/api/payments/webhook", content=raw, headers={"X-Signature": signature, **content_type}
    )
    duplicate_key(r, "amount")
    got = await client.get(
        f"/api/bookings/{booking['bookingId']}", headers=auth("customer", customer)
    )
    assert got.json()["status"] == "HOLD", got.text
    paid = await db.fetchval("SELECT count(*) FROM payment WHERE provider_txn_id = $1", txn)
    assert paid == 0


async def test_a_signed_match_result_naming_a_score_twice_is_422_and_held_nowhere(
    app: tuple[httpx.AsyncClient, Container], db: asyncpg.Connection
) -> None:
    client, container = app
    clock = container.clock
    assert isinstance(clock, OffsetClock)
    match = await make_match(client, timedelta(minutes=1))
    kick_off(clock, match)
    event = f"prov-{uuid.uuid4()}"
    raw = (
        f'{{"matchExternalId":"{match["externalId"]}","homeScore":2,"awayScore":1,'
        f'"status":"FINISHED","providerEventId":"{event}","homeScore":0}}'
    ).encode()
    signature = sign_webhook(RESULTS_SECRET, raw, int(clock.now().timestamp()))
    r = await client.post(
        "/api/webhooks/match-results", content=raw, headers={"X-Signature": signature}
    )
    duplicate_key(r, "homeScore")
    held = await db.fetchval(
        "SELECT count(*) FROM webhook_events_fallback WHERE provider_event_id = $1", event
    )
    kept = await db.fetchval(
        "SELECT count(*) FROM webhook_events_rejected WHERE body = $1", raw.decode()
    )
    assert (held, kept) == (0, 1)  # refused, and kept for investigation


# -- two Idempotency-Key headers ---------------------------------------------------------------


def two_keys(headers: dict[str, str], first: str, second: str) -> list[tuple[str, str]]:
    return [*headers.items(), ("Idempotency-Key", first), ("Idempotency-Key", second)]


async def test_a_transfer_with_two_idempotency_keys_is_400_and_moves_nothing(
    app: tuple[httpx.AsyncClient, Container], db: asyncpg.Connection
) -> None:
    client, _ = app
    a, owner = await make_account(client, 1_000)
    b, _ = await make_account(client, 0)
    before = await movements(db, a, b)
    body: dict[str, Any] = {"fromAccountId": a, "toAccountId": b, "amount": 100}
    k1, k2 = str(uuid.uuid4()), str(uuid.uuid4())
    for pair in ((k1, k2), (k2, k1), (k1, k1)):
        r = await client.post(
            "/api/transfers", json=body, headers=two_keys(auth("bettor", owner), *pair)
        )
        problem(r, 400, "idempotency_key_required")
    assert await movements(db, a, b) == before
    # Each key alone is its own request, once.
    for k in (k1, k2, k1):
        r = await client.post(
            "/api/transfers", json=body, headers={**auth("bettor", owner), "Idempotency-Key": k}
        )
        assert r.status_code in (200, 201), r.text
    assert (await balance(client, a), await balance(client, b)) == (800, 200)


async def test_a_deposit_and_a_booking_with_two_idempotency_keys_are_400(
    app: tuple[httpx.AsyncClient, Container], db: asyncpg.Connection
) -> None:
    client, _ = app
    a, _ = await make_account(client, 0)
    r = await client.post(
        f"/api/accounts/{a}/deposits",
        json={"amount": 500, "reference": f"dep-{uuid.uuid4()}"},
        headers=two_keys(SERVICE, "k-1", "k-2"),
    )
    problem(r, 400, "idempotency_key_required")
    assert await balance(client, a) == 0
    _, slots = await make_slots(client, capacity=1)
    patient = new_id()
    r = await client.post(
        "/api/appointments",
        json={"slotId": slots[0]["id"], "patientId": patient},
        headers=two_keys(auth("patient", patient), "k-1", "k-2"),
    )
    problem(r, 400, "idempotency_key_required")
    n = await db.fetchval("SELECT count(*) FROM appointment WHERE patient_id = $1", patient)
    assert n == 0
