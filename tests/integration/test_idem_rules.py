"""Issue 22, the small leaks of the request rules, through HTTP on both paths
(hot routes dispatched in front of the middleware stack, and through it):

- a finished request's replay returns its stored answer and never counts
  against a rate limit;
- Idempotency-Keys belong to the user (sub) and the endpoint, whatever role
  the token carries;
- the role is checked before the request is parsed (403 before any 422), on
  every route with a role rule;
- somebody else's resource is 404, as one that does not exist;
- instants are RFC 3339 with an offset, dates YYYY-MM-DD, nothing else."""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import AsyncIterator
from datetime import UTC, date, datetime, timedelta
from typing import Any

import asyncpg
import httpx
import pytest
from fastapi.routing import APIRoute

from reservo.app import create_app
from reservo.appointments.gate import seen_key
from reservo.bootstrap import Container, build
from reservo.core.db.migrate import available
from reservo.core.http.auth import ROLES
from reservo.core.http.callers import Roles
from reservo.core.kernel.clock import OffsetClock
from reservo.settings import Settings
from tests.helpers.appointments import book, make_slots
from tests.helpers.auth import ADMIN, auth, new_id
from tests.helpers.betting import make_account, make_match, place
from tests.helpers.rentals import at, confirmed_booking, hold, make_car

SERVICE = auth("service", 1)
HTTP_JOB = {"category": "http", "urgency": 3, "payload": {"url": "http://x.test/"}}


@pytest.fixture(params=[True, False], ids=["front", "stack"])
async def app(
    request: pytest.FixtureRequest, base_settings: Settings
) -> AsyncIterator[tuple[httpx.AsyncClient, Container]]:
    """A client of an app whose hot routes are dispatched in front of the
    middleware stack, or through it like every other route."""
    container = build(base_settings.with_(lean_paths=request.param), OffsetClock())
    transport = httpx.ASGITransport(app=create_app(container))
    async with httpx.AsyncClient(transport=transport, base_url="http://reservo.test") as c:
        yield c, container
    await container.close()


def code(r: httpx.Response) -> tuple[int, str | None]:
    return r.status_code, r.json().get("code") if r.status_code >= 400 else None


# -- replays are never rate limited ---------------------------------------------------------


async def test_a_booking_replayed_twenty_times_is_never_rate_limited(
    app: tuple[httpx.AsyncClient, Container], db: asyncpg.Connection
) -> None:
    client, _ = app
    _, slots = await make_slots(client, capacity=3)
    patient, key = new_id(), f"k-{uuid.uuid4()}"
    first = await book(client, slots[0]["id"], patient, key)
    assert first.status_code == 201, first.text
    for _ in range(20):
        again = await book(client, slots[0]["id"], patient, key)
        assert (again.status_code, again.json()) == (200, first.json())
    # The replays were not counted: the patient's next booking is its second attempt.
    assert (await book(client, slots[1]["id"], patient)).status_code == 201
    n = await db.fetchval("SELECT count(*) FROM appointment WHERE patient_id = $1", patient)
    assert n == 2


async def test_a_replay_gets_its_answer_when_the_limit_is_used_up_and_redis_forgot_it(
    app: tuple[httpx.AsyncClient, Container],
) -> None:
    client, container = app
    _, slots = await make_slots(client, capacity=3)
    patient, key = new_id(), f"k-{uuid.uuid4()}"
    first = await book(client, slots[0]["id"], patient, key)
    assert first.status_code == 201
    for _ in range(4):  # the rest of the five attempts: the limit is used up
        await book(client, 2**62, patient)
    assert (await book(client, slots[1]["id"], patient)).status_code == 429
    # Redis no longer knows that the key reached the database (expired, restarted).
    await container.cache.clear_mark(seen_key(f"{patient}:POST /api/appointments:{key}"))
    again = await book(client, slots[0]["id"], patient, key)
    assert (again.status_code, again.json()) == (200, first.json())
    # A new request is still limited, and another body under the key is no replay.
    assert (await book(client, slots[1]["id"], patient)).status_code == 429
    assert (await book(client, slots[1]["id"], patient, key)).status_code == 429


async def test_a_rental_hold_replayed_twenty_times_is_never_rate_limited(
    app: tuple[httpx.AsyncClient, Container],
) -> None:
    client, _ = app
    car, customer, key = await make_car(client), new_id(), str(uuid.uuid4())
    first = await hold(client, car["id"], customer, at(100), at(124), key)
    assert first.status_code == 201, first.text
    for _ in range(20):
        again = await hold(client, car["id"], customer, at(100), at(124), key)
        assert (again.status_code, again.json()) == (200, first.json())


# -- keys belong to the user, whatever the role -------------------------------------------


async def test_one_user_under_two_roles_moves_money_once_per_key(
    app: tuple[httpx.AsyncClient, Container], db: asyncpg.Connection
) -> None:
    client, _ = app
    source, owner = await make_account(client, 100)
    target, _ = await make_account(client, 0)
    body = {"fromAccountId": source, "toAccountId": target, "amount": 10}
    key = str(uuid.uuid4())
    as_bettor = {**auth("bettor", owner), "Idempotency-Key": key}
    as_admin = {**auth("admin", owner), "Idempotency-Key": key}
    first = await client.post("/api/transfers", json=body, headers=as_bettor)
    assert first.status_code == 201, first.text
    again = await client.post("/api/transfers", json=body, headers=as_admin)
    assert (again.status_code, again.json()) == (200, first.json())
    other = await client.post("/api/transfers", json={**body, "amount": 11}, headers=as_admin)
    assert code(other) == (422, "idempotency_key_reused")
    balance = await db.fetchval("SELECT balance FROM wallet_account WHERE id = $1", source)
    assert balance == 90


async def test_one_user_racing_under_two_roles_moves_money_once(
    app: tuple[httpx.AsyncClient, Container], db: asyncpg.Connection
) -> None:
    client, _ = app
    source, owner = await make_account(client, 100)
    target, _ = await make_account(client, 0)
    body = {"fromAccountId": source, "toAccountId": target, "amount": 10}
    key = str(uuid.uuid4())
    roles = ["bettor", "admin"] * 10
    gate = asyncio.Event()

    async def one(role: str) -> httpx.Response:
        await gate.wait()
        headers = {**auth(role, owner), "Idempotency-Key": key}
        return await client.post("/api/transfers", json=body, headers=headers)

    tasks = [asyncio.create_task(one(r)) for r in roles]
    await asyncio.sleep(0.05)
    gate.set()
    answers = await asyncio.gather(*tasks)
    statuses = sorted(r.status_code for r in answers)
    assert statuses.count(201) == 1 and set(statuses) <= {200, 201, 409}, statuses
    balance = await db.fetchval("SELECT balance FROM wallet_account WHERE id = $1", source)
    assert balance == 90
    moved = await db.fetchval(
        "SELECT count(*) FROM wallet_transfer WHERE from_account_id = $1 AND kind = 'TRANSFER'",
        source,
    )
    assert moved == 1


# -- the role before the body ----------------------------------------------------------------

# Routes any authenticated caller may use: no role rule to check first.
ANYONE = {
    ("GET", "/api/doctors/{doctorId}/slots"),
    ("GET", "/api/cars"),
    ("GET", "/api/cars/{carId}/quote"),
    ("GET", "/api/matches"),
    ("GET", "/api/matches/{matchId}"),
}


def _role_rule(route: APIRoute) -> frozenset[str] | None:
    """The roles a route's Roles dependency admits (admin aside), or None."""
    stack = list(route.dependant.dependencies)
    while stack:
        dep = stack.pop()
        if isinstance(dep.call, Roles):
            return dep.call.roles
        stack.extend(dep.dependencies)
    return None


def _bearer_routes(container: Container) -> list[tuple[str, str, APIRoute]]:
    """Every (method, path, route) of the modules' /api routers."""
    out = []
    for module in container.modules:
        for router in module.routers:
            for route in router.routes:
                if isinstance(route, APIRoute) and route.path.startswith("/api/"):
                    out.extend((method, route.path, route) for method in sorted(route.methods))
    return out


async def test_every_api_route_has_a_role_rule_or_is_open_to_anyone(
    base_settings: Settings,
) -> None:
    container = build(base_settings, OffsetClock())
    try:
        routes = _bearer_routes(container)
    finally:
        await container.close()
    assert len(routes) > 40
    webhooks = {"/api/payments/webhook", "/api/webhooks/match-results"}
    for method, path, route in routes:
        if path in webhooks:
            continue
        ruled = _role_rule(route) is not None
        assert ruled != ((method, path) in ANYONE), (method, path)


@pytest.mark.parametrize("body", [b"{}", b"[]", b'{"unknown": 1}'])
async def test_a_wrong_role_with_an_invalid_request_is_403_on_every_ruled_route(
    app: tuple[httpx.AsyncClient, Container], body: bytes
) -> None:
    client, container = app
    checked = 0
    for method, path, route in _bearer_routes(container):
        rule = _role_rule(route)
        if rule is None:
            continue
        url = path.replace("{", "").replace("}", "")  # ids that are not ids: 422 later
        for role in sorted(ROLES - rule - {"admin"}):
            headers = {
                **auth(role, 1),
                "Content-Type": "application/json",
                "Idempotency-Key": "",  # malformed too
            }
            r = await client.request(method, url, content=body, headers=headers)
            assert code(r) == (403, "forbidden"), (method, path, role, r.text)
            checked += 1
    assert checked > 100


async def test_a_patient_posting_nothing_to_an_admin_route_learns_no_fields(
    app: tuple[httpx.AsyncClient, Container],
) -> None:
    client, _ = app
    for path in ("/api/doctors", "/api/cars", "/api/matches", "/api/accounts"):
        r = await client.post(path, json={}, headers=auth("patient", 1))
        assert code(r) == (403, "forbidden") and "errors" not in r.json()
    # The hot routes with a well-formed body and the wrong role: 403 as well.
    r = await client.post(
        "/api/transfers",
        json={"fromAccountId": 1, "toAccountId": 2, "amount": 1},
        headers={**auth("patient", 1), "Idempotency-Key": "k"},
    )
    assert code(r) == (403, "forbidden")
    r = await client.post(
        "/api/jobs",
        json=HTTP_JOB,
        headers=auth("bettor", 1),
    )
    assert code(r) == (403, "forbidden")


# -- somebody else's is not found ---------------------------------------------------------


async def test_somebody_elses_resources_answer_as_missing_ones(
    app: tuple[httpx.AsyncClient, Container], clock: OffsetClock
) -> None:
    client, _ = app
    missing = 2**62
    # Appointments.
    _, slots = await make_slots(client, capacity=2)
    appt = (await book(client, slots[0]["id"], new_id())).json()["id"]
    stranger = auth("patient", new_id())
    for target in (appt, missing):
        for r in (
            await client.get(f"/api/appointments/{target}", headers=stranger),
            await client.delete(f"/api/appointments/{target}", headers=stranger),
            await client.post(
                f"/api/appointments/{target}/reschedule",
                json={"slotId": slots[1]["id"]},
                headers={**stranger, "Idempotency-Key": str(uuid.uuid4())},
            ),
        ):
            assert code(r) == (404, "appointment_not_found"), r.text
    # Accounts, their statements, bets and transfers; bets.
    account, owner = await make_account(client, 100)
    target, _ = await make_account(client, 0)
    match = await make_match(client)
    bet = (await place(client, account, owner, 5, [(match["id"], "BTTS", "NO")])).json()["id"]
    nosy = new_id()
    for acc in (account, missing):
        for path in (f"/api/accounts/{acc}", f"/api/accounts/{acc}/statement"):
            r = await client.get(path, headers=auth("bettor", nosy))
            assert code(r) == (404, "account_not_found"), r.text
        r = await client.get(f"/api/accounts/{acc}/bets", headers=auth("bettor", nosy))
        assert code(r) == (404, "account_not_found")
        r = await client.post(
            "/api/transfers",
            json={"fromAccountId": acc, "toAccountId": target, "amount": 1},
            headers={**auth("bettor", nosy), "Idempotency-Key": str(uuid.uuid4())},
        )
        assert code(r) == (404, "account_not_found")
        r = await place(client, acc, nosy, 1, [(match["id"], "BTTS", "NO")])
        assert code(r) == (404, "account_not_found")
    for b in (bet, missing):
        r = await client.get(f"/api/bets/{b}", headers=auth("bettor", nosy))
        assert code(r) == (404, "bet_not_found")
    # Rental bookings and a car's calendar.
    _, booking, _ = await confirmed_booking(client, clock, start_h=200)
    other_host = auth("host", new_id())
    for b in (booking["bookingId"], missing):
        for h in (auth("customer", new_id()), other_host):
            assert code(await client.get(f"/api/bookings/{b}", headers=h)) == (
                404,
                "booking_not_found",
            )
            r = await client.post(f"/api/bookings/{b}/cancel", headers=h)
            assert code(r) == (404, "booking_not_found")
        for step in ("pickup", "return"):
            r = await client.post(f"/api/bookings/{b}/{step}", headers=other_host)
            assert code(r) == (404, "booking_not_found")
    car = await make_car(client)
    window = {"from": at(1).isoformat(), "to": at(48).isoformat()}
    for c in (car["id"], missing):
        r = await client.get(f"/api/cars/{c}/calendar", params=window, headers=other_host)
        assert code(r) == (404, "car_not_found")


# -- instants and dates ---------------------------------------------------------------------

NOT_INSTANTS: list[Any] = [
    1_800_000_000,
    "1800000000",
    1_800_000_000.5,
    "2027-01-25",
    "2027-01-25T08:00:00",  # no offset
    "2027-01-25 08:00:00+00:00",
    "2027-01-25T08:00Z",
    "20270125T080000Z",
    "2027-W04-1T08:00:00Z",
    "2027-01-25T08:00:00+0700",
]
NOT_DAYS: list[Any] = [
    "2027-01-25T00:00:00",
    "2027-01-25T00:00:00Z",
    20270125,
    "20270125",
    1_800_000_000,
    "2027-W04-1",
    "2027-025",
]


async def test_instants_in_bodies_are_rfc3339_with_an_offset(
    app: tuple[httpx.AsyncClient, Container],
) -> None:
    client, _ = app
    car = await make_car(client)
    for bad in NOT_INSTANTS:
        r = await client.post(
            "/api/jobs",
            json={**HTTP_JOB, "runAt": bad},
            headers=SERVICE,
        )
        assert code(r) == (422, "validation_error"), (bad, r.text)
        r = await client.post(
            "/api/matches",
            json={
                "externalId": f"x-{uuid.uuid4()}",
                "home": "A",
                "away": "B",
                "startsAt": bad,
                "odds": {"BTTS": {"YES": "1.70", "NO": "2.10"}},
            },
            headers=ADMIN,
        )
        assert code(r) == (422, "validation_error"), (bad, r.text)
        customer = new_id()
        r = await client.post(
            "/api/bookings",
            json={"carId": car["id"], "customerId": customer, "from": bad, "to": bad},
            headers={**auth("customer", customer), "Idempotency-Key": str(uuid.uuid4())},
        )
        assert code(r) == (422, "validation_error"), (bad, r.text)
    good = (at(48) + timedelta(minutes=1)).isoformat().replace("+00:00", "Z")
    r = await client.post(
        "/api/jobs",
        json={**HTTP_JOB, "runAt": good},
        headers=SERVICE,
    )
    assert r.status_code == 201, r.text


async def test_instants_and_dates_in_query_strings_are_strict(
    app: tuple[httpx.AsyncClient, Container],
) -> None:
    client, _ = app
    host = new_id()
    car = await make_car(client, host=host)
    doctor, _ = await make_slots(client)
    ok = at(24).isoformat()
    for bad in NOT_INSTANTS:
        for path, who in (
            ("/api/cars", auth("customer", 1)),
            (f"/api/cars/{car['id']}/quote", auth("customer", 1)),
            (f"/api/cars/{car['id']}/calendar", auth("host", host)),
        ):
            params = {"city": car["city"], "from": str(bad), "to": ok}
            r = await client.get(path, params=params, headers=who)
            assert code(r) == (422, "validation_error"), (path, bad, r.text)
    for bad in NOT_DAYS:
        r = await client.get(
            f"/api/doctors/{doctor}/slots", params={"date": str(bad)}, headers=ADMIN
        )
        assert code(r) == (422, "validation_error"), (bad, r.text)
        r = await client.get(
            f"/api/doctors/{doctor}/agenda", params={"date": str(bad)}, headers=ADMIN
        )
        assert code(r) == (422, "validation_error"), (bad, r.text)
    today = date.today().isoformat()
    r = await client.get(f"/api/doctors/{doctor}/slots", params={"date": today}, headers=ADMIN)
    assert r.status_code == 200


async def test_dates_in_bodies_are_yyyy_mm_dd(app: tuple[httpx.AsyncClient, Container]) -> None:
    client, _ = app
    doctor, _ = await make_slots(client)
    for bad in NOT_DAYS:
        body = {
            "from": bad,
            "to": bad,
            "weekdays": [1, 2, 3, 4, 5, 6, 7],
            "startTime": "10:00",
            "endTime": "11:00",
            "slotMinutes": 30,
        }
        r = await client.post(f"/api/doctors/{doctor}/schedules", json=body, headers=ADMIN)
        assert code(r) == (422, "validation_error"), (bad, r.text)


async def test_migration_0030_renames_stored_keys_to_their_user(own_database: str) -> None:
    """Keys stored as "<role>:<sub>" before the upgrade keep answering their
    retries under "<sub>"; one user's same key under two roles keeps the first."""
    (sql,) = [m.sql for m in available() if m.version == 30]
    conn = await asyncpg.connect(own_database)
    try:
        insert = (
            "INSERT INTO idempotency_key (caller, endpoint, key, request_hash, status,"
            " response_status, response_body, created_at)"
            " VALUES ($1, 'POST /api/transfers', $2, '\\x00', 'DONE', 201, $3, $4)"
        )
        t0 = datetime(2026, 1, 1, tzinfo=UTC)
        await conn.execute(insert, "bettor:7", "k1", '{"first": true}', t0)
        await conn.execute(insert, "admin:7", "k1", '{"first": false}', t0 + timedelta(seconds=1))
        await conn.execute(insert, "service:8", "k2", '{"other": 1}', t0)
        await conn.execute(sql)
        rows = await conn.fetch(
            "SELECT caller, key, response_body::text AS body FROM idempotency_key ORDER BY key"
        )
    finally:
        await conn.close()
    assert [tuple(r) for r in rows] == [("7", "k1", '{"first": true}'), ("8", "k2", '{"other": 1}')]
