"""Every error code of the Rentals section, through HTTP, and who may do what."""

from __future__ import annotations

import asyncio
import uuid
from datetime import timedelta

import asyncpg
import httpx
import orjson

from reservo.bootstrap import Container
from reservo.core.http.auth import sign_webhook
from reservo.core.kernel.clock import OffsetClock
from tests.helpers.auth import ADMIN, PAY_SECRET, auth, new_id
from tests.helpers.rentals import at, confirmed_booking, hold, make_car, webhook


def code(r: httpx.Response) -> tuple[int, str]:
    assert r.headers["content-type"].startswith("application/problem+json"), r.text
    return r.status_code, r.json()["code"]


async def test_car_errors(client: httpx.AsyncClient) -> None:
    car = await make_car(client)
    body = {"plate": car["plate"], "model": "X", "city": "Y", "dailyPrice": 1, "hostId": 5}
    assert code(await client.post("/api/cars", json=body, headers=ADMIN)) == (409, "plate_taken")
    for bad in (
        {**body, "plate": "ok-1", "dailyPrice": 0},
        {**body, "plate": "ok-1", "dailyPrice": "10"},
        {**body, "plate": " "},
        {**body, "plate": "ok-1", "hostId": -1},
        {**body, "plate": "ok-1", "extra": 1},
    ):
        assert code(await client.post("/api/cars", json=bad, headers=ADMIN)) == (
            422,
            "validation_error",
        )
    r = await client.post("/api/cars", content=b"{not json", headers=ADMIN)
    assert code(r) == (422, "validation_error")
    host = auth("host", 5)
    assert code(await client.post("/api/cars", json=body, headers=host)) == (403, "forbidden")
    assert code(await client.post("/api/cars", json=body)) == (401, "unauthenticated")


async def test_booking_errors(client: httpx.AsyncClient) -> None:
    customer = new_id()
    car = await make_car(client)
    start, end = at(30), at(40)
    r = await hold(client, 2**62, customer, start, end)
    assert code(r) == (404, "car_not_found")
    assert (await hold(client, car["id"], customer, start, end)).status_code == 201
    r = await hold(client, car["id"], new_id(), start, end)
    assert code(r) == (409, "car_unavailable")
    # Bad periods: reversed, empty, in the past, too long, naive, absurd.
    for s, e in [
        (end, start),
        (start, start),
        (at(-5), at(5)),
        (start, start + timedelta(days=120)),
    ]:
        assert code(await hold(client, car["id"], new_id(), s, e)) == (422, "validation_error")
    for s, e in [
        ("2030-01-01T10:00:00", "2030-01-02T10:00:00"),
        ("0001-01-01T00:00:00+01:00", "0001-01-02T00:00:00+01:00"),
        ("9999-12-31T23:00:00-05:00", "9999-12-31T23:30:00-05:00"),
        ("tomorrow", "later"),
    ]:
        other = new_id()
        headers = {**auth("customer", other), "Idempotency-Key": str(uuid.uuid4())}
        body = {"carId": car["id"], "customerId": other, "from": s, "to": e}
        r = await client.post("/api/bookings", json=body, headers=headers)
        assert code(r) == (422, "validation_error"), (s, r.text)


async def test_hold_rate_limit_is_429_with_retry_after(client: httpx.AsyncClient) -> None:
    customer = new_id()
    car = await make_car(client)
    for i in range(3):
        r = await hold(client, car["id"], customer, at(30 + 20 * i), at(31 + 20 * i))
        assert r.status_code == 201, r.text
    r = await hold(client, car["id"], customer, at(200), at(201))
    assert code(r) == (429, "rate_limited")
    assert int(r.headers["Retry-After"]) >= 1


async def test_idempotency_codes(client: httpx.AsyncClient, container: Container) -> None:
    customer = new_id()
    car = await make_car(client)
    start, end = at(30), at(40)
    body = {
        "carId": car["id"],
        "customerId": customer,
        "from": start.isoformat(),
        "to": end.isoformat(),
    }
    headers = auth("customer", customer)
    r = await client.post("/api/bookings", json=body, headers=headers)
    assert code(r) == (400, "idempotency_key_required")
    r = await client.post("/api/bookings", json=body, headers={**headers, "Idempotency-Key": "a b"})
    assert code(r) == (400, "idempotency_key_required")
    key = str(uuid.uuid4())
    first = await hold(client, car["id"], customer, start, end, key=key)
    again = await hold(client, car["id"], customer, start, end, key=key)
    assert (first.status_code, again.status_code) == (201, 200)
    assert again.json() == first.json()
    r = await hold(client, car["id"], customer, start, end + timedelta(hours=1), key=key)
    assert code(r) == (422, "idempotency_key_reused")
    # A request still running under the same key.
    key = str(uuid.uuid4())
    raw = orjson.dumps({**body, "from": at(60).isoformat(), "to": at(70).isoformat()})
    await container.idempotency.begin(str(customer), "POST /api/bookings", key, raw)
    r = await client.post(
        "/api/bookings",
        content=raw,
        headers={**headers, "Idempotency-Key": key, "Content-Type": "application/json"},
    )
    assert code(r) == (409, "request_in_progress")


async def test_concurrent_same_key_creates_one_booking(
    client: httpx.AsyncClient, db: asyncpg.Connection
) -> None:
    customer = new_id()
    car = await make_car(client)
    key = str(uuid.uuid4())
    rs = await asyncio.gather(
        *(hold(client, car["id"], customer, at(30), at(40), key=key) for _ in range(5))
    )
    assert {r.status_code for r in rs} <= {200, 201, 409}
    assert [r.status_code for r in rs].count(201) == 1
    n = await db.fetchval("SELECT count(*) FROM booking WHERE customer_id = $1", customer)
    assert n == 1


async def test_webhook_signature_and_body(
    client: httpx.AsyncClient, clock: OffsetClock, db: asyncpg.Connection
) -> None:
    car = await make_car(client)
    b = (await hold(client, car["id"], new_id(), at(30), at(40))).json()
    r = await webhook(client, clock, b["bookingId"], b["depositAmount"], secret="wrong")
    assert code(r) == (401, "bad_signature")
    raw = orjson.dumps(
        {"bookingId": b["bookingId"], "providerTxnId": "x1", "amount": 1, "status": "SUCCEEDED"}
    )
    url = "/api/payments/webhook"
    assert code(await client.post(url, content=raw)) == (401, "bad_signature")
    stale = sign_webhook(PAY_SECRET, raw, int(clock.now().timestamp()) - 301)
    r = await client.post(url, content=raw, headers={"X-Signature": stale})
    assert code(r) == (401, "bad_signature")
    # A valid signature over a different body than the one sent.
    sig = sign_webhook(PAY_SECRET, raw, int(clock.now().timestamp()))
    r = await client.post(url, content=raw + b" ", headers={"X-Signature": sig})
    assert code(r) == (401, "bad_signature")
    assert (
        await db.fetchval("SELECT count(*) FROM payment WHERE booking_id = $1", b["bookingId"]) == 0
    )
    # Signed but malformed: 422, nothing processed.
    for bad in (
        b"{oops",
        b'{"bookingId": 1}',
        b'{"bookingId":1,"providerTxnId":"a","amount":-1,"status":"SUCCEEDED"}',
    ):
        sig = sign_webhook(PAY_SECRET, bad, int(clock.now().timestamp()))
        r = await client.post(url, content=bad, headers={"X-Signature": sig})
        assert code(r) == (422, "validation_error")
    # Signed, valid, but for no booking.
    r = await webhook(client, clock, 2**62, 100)
    assert code(r) == (404, "booking_not_found")
    # Too little money: not confirmed, refunded.
    r = await webhook(client, clock, b["bookingId"], b["depositAmount"] - 1)
    assert r.json() == {"result": "refund_requested"}


async def test_booking_access_rules(client: httpx.AsyncClient, clock: OffsetClock) -> None:
    car, b, customer = await confirmed_booking(client, clock, start_h=100)
    other_car = await make_car(client)
    url = f"/api/bookings/{b['bookingId']}"
    owner, host = auth("customer", customer), auth("host", car["hostId"])
    stranger, other_host = auth("customer", new_id()), auth("host", other_car["hostId"])
    for h in (owner, host, ADMIN):
        assert (await client.get(url, headers=h)).status_code == 200
    # Somebody else's booking is answered as one that does not exist; a role
    # that may never act on bookings is 403.
    hidden = (404, "booking_not_found")
    for h, refusal in ((stranger, hidden), (other_host, hidden), (auth("patient", customer), None)):
        want = refusal or (403, "forbidden")
        assert code(await client.get(url, headers=h)) == want
        assert code(await client.post(f"{url}/cancel", headers=h)) == want
    # Pickup and return belong to the car's host (and admin), not the customer.
    for h, want in ((owner, (403, "forbidden")), (other_host, hidden)):
        assert code(await client.post(f"{url}/pickup", headers=h)) == want
        assert code(await client.post(f"{url}/return", headers=h)) == want
    # A customer books only for themself.
    r = await hold(client, car["id"], customer, at(300), at(310))
    assert r.status_code == 201
    body = {
        "carId": car["id"],
        "customerId": customer,
        "from": at(400).isoformat(),
        "to": at(410).isoformat(),
    }
    r = await client.post(
        "/api/bookings", json=body, headers={**stranger, "Idempotency-Key": "k-1"}
    )
    assert code(r) == (403, "forbidden")
    assert code(await client.get(url)) == (401, "unauthenticated")
    assert code(await client.get("/api/bookings/999999999999", headers=ADMIN)) == (
        404,
        "booking_not_found",
    )
    assert code(await client.post("/api/bookings/999999999999/cancel", headers=ADMIN)) == (
        404,
        "booking_not_found",
    )
    assert code(await client.get("/api/bookings/abc", headers=ADMIN)) == (422, "validation_error")


async def test_search_validation(client: httpx.AsyncClient) -> None:
    h = auth("customer", new_id())
    good = {"city": "X", "from": at(30).isoformat(), "to": at(40).isoformat()}
    assert (await client.get("/api/cars", params=good, headers=h)).status_code == 200
    assert code(await client.get("/api/cars", params=good)) == (401, "unauthenticated")
    for bad in (
        {**good, "city": ""},
        {k: v for k, v in good.items() if k != "to"},
        {**good, "from": good["to"], "to": good["from"]},
        {**good, "from": "2030-01-01T10:00:00"},
        {**good, "limit": "0"},
        {**good, "from": "nonsense"},
        {**good, "city": "a\x00b"},
    ):
        r = await client.get("/api/cars", params=bad, headers=h)
        assert code(r) == (422, "validation_error"), bad
