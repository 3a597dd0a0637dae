"""Rentals, second release, through HTTP: a customer's bookings and the car search
(keyset pages), a car's calendar for its host, a price quote; their errors, plans
and OpenAPI."""

from __future__ import annotations

import base64
from collections.abc import AsyncIterator
from datetime import UTC, datetime, timedelta
from typing import Any

import asyncpg
import httpx
import pytest

from reservo.app import create_app
from reservo.bootstrap import Container, build
from reservo.core.kernel.clock import OffsetClock
from reservo.settings import Settings
from tests.helpers.auth import ADMIN, auth, new_id
from tests.helpers.plans import plans_of
from tests.helpers.rentals import at, hold, make_car, webhook


def code(r: httpx.Response) -> tuple[int, str]:
    assert r.headers["content-type"].startswith("application/problem+json"), r.text
    return r.status_code, r.json()["code"]


@pytest.fixture
async def roomy(base_settings: Settings, clock: OffsetClock) -> AsyncIterator[httpx.AsyncClient]:
    """The real app with a hold rate limit high enough for one customer's many holds."""
    c = build(base_settings.with_(rentals_hold_rate_limit=1000), clock)
    transport = httpx.ASGITransport(app=create_app(c, owns_container=False))
    async with httpx.AsyncClient(transport=transport, base_url="http://reservo.test") as client:
        yield client
    await c.close()


async def _held(client: httpx.AsyncClient, car: int, customer: int, h: float) -> dict[str, Any]:
    r = await hold(client, car, customer, at(h), at(h + 1))
    assert r.status_code == 201, r.text
    b: dict[str, Any] = r.json()
    return b


async def _pages(
    client: httpx.AsyncClient, url: str, params: dict[str, Any], headers: dict[str, str]
) -> list[list[dict[str, Any]]]:
    pages: list[list[dict[str, Any]]] = []
    after = None
    while True:
        q = {**params, **({"after": after} if after else {})}
        r = await client.get(url, params=q, headers=headers)
        assert r.status_code == 200, r.text
        body = r.json()
        assert set(body) == {"items", "next"}
        pages.append(body["items"])
        after = body["next"]
        if after is None:
            return pages


# -- GET /api/customers/{customerId}/bookings -------------------------------------------------


async def test_customer_bookings_newest_first_page_by_page_and_by_status(
    roomy: httpx.AsyncClient, clock: OffsetClock
) -> None:
    customer, other = new_id(), new_id()
    car = (await make_car(roomy))["id"]
    # One that will have expired (no job flips it: the list must still say EXPIRED).
    stale = await _held(roomy, car, customer, 30)
    clock.advance(timedelta(seconds=901))
    live = [await _held(roomy, car, customer, 40 + 5 * i) for i in range(4)]
    await _held(roomy, car, other, 100)
    paid, cancelled = live[0], live[1]
    w = await webhook(roomy, clock, paid["bookingId"], paid["depositAmount"])
    assert w.json() == {"result": "confirmed"}
    mine = auth("customer", customer)
    r = await roomy.post(f"/api/bookings/{cancelled['bookingId']}/cancel", headers=mine)
    assert r.json()["status"] == "CANCELLED"

    url = f"/api/customers/{customer}/bookings"
    pages = await _pages(roomy, url, {"limit": 2}, mine)
    assert [len(p) for p in pages] == [2, 2, 1]
    items = [b for p in pages for b in p]
    newest_first = [b["bookingId"] for b in reversed([stale, *live])]
    assert [b["bookingId"] for b in items] == newest_first
    # Each item is the booking as GET /api/bookings/{bookingId} shows it.
    for b in items:
        one = await roomy.get(f"/api/bookings/{b['bookingId']}", headers=mine)
        assert one.json() == b
    status = {b["bookingId"]: b["status"] for b in items}
    assert status == {
        stale["bookingId"]: "EXPIRED",
        paid["bookingId"]: "CONFIRMED",
        cancelled["bookingId"]: "CANCELLED",
        live[2]["bookingId"]: "HOLD",
        live[3]["bookingId"]: "HOLD",
    }
    by_status = {}
    for s in ("HOLD", "CONFIRMED", "ON_TRIP", "COMPLETED", "CANCELLED", "EXPIRED"):
        pages = await _pages(roomy, url, {"status": s, "limit": 1}, mine)
        by_status[s] = [b["bookingId"] for p in pages for b in p]
        assert all(b["status"] == s for p in pages for b in p)
    assert by_status == {
        "HOLD": [live[3]["bookingId"], live[2]["bookingId"]],
        "CONFIRMED": [paid["bookingId"]],
        "ON_TRIP": [],
        "COMPLETED": [],
        "CANCELLED": [cancelled["bookingId"]],
        "EXPIRED": [stale["bookingId"]],
    }
    # An admin sees the same list; a customer without bookings an empty one.
    r = await roomy.get(url, headers=ADMIN)
    assert [b["bookingId"] for b in r.json()["items"]] == newest_first
    nobody = new_id()
    r = await roomy.get(f"/api/customers/{nobody}/bookings", headers=auth("customer", nobody))
    assert r.json() == {"items": [], "next": None}
    # The default page is 50.
    r = await roomy.get(url, headers=mine)
    assert len(r.json()["items"]) == 5 and r.json()["next"] is None


async def test_customer_bookings_errors(client: httpx.AsyncClient) -> None:
    customer = new_id()
    url = f"/api/customers/{customer}/bookings"
    assert code(await client.get(url)) == (401, "unauthenticated")
    for who in (auth("customer", new_id()), auth("host", customer), auth("bettor", customer)):
        assert code(await client.get(url, headers=who)) == (403, "forbidden")
    mine = auth("customer", customer)

    def b64(raw: bytes) -> str:
        return base64.urlsafe_b64encode(raw).decode().rstrip("=")

    for bad in (
        "x",
        "!!!",
        b64(b"[1]"),
        b64(b'["a", 1]'),
        b64(b"[1, 2, 3]"),
        b64(b"[0, 5]"),
        b64(b"[1, 5]"),  # 1970: no booking was stamped then
        b64(b"[99999999999999999, 5]"),
        b64(b"{}"),
    ):
        r = await client.get(url, params={"after": bad}, headers=mine)
        assert code(r) == (422, "validation_error"), bad
    for params in (
        {"limit": 0},
        {"limit": 201},
        {"limit": "x"},
        {"status": "hold"},
        {"status": "LOST"},
        {"after": "a" * 201},
    ):
        r = await client.get(url, params=params, headers=mine)
        assert code(r) == (422, "validation_error"), params
    for bad_id in ("0", "-1", "x", str(2**63)):
        r = await client.get(f"/api/customers/{bad_id}/bookings", headers=ADMIN)
        assert code(r) == (422, "validation_error"), bad_id
    r = await client.get(url, params={"limit": 200}, headers=mine)
    assert r.status_code == 200


# -- GET /api/cars/{carId}/calendar ------------------------------------------------------------


async def test_calendar_shows_what_blocks_the_car(
    client: httpx.AsyncClient, clock: OffsetClock
) -> None:
    host = new_id()
    car = (await make_car(client, host=host))["id"]
    expired = await _held(client, car, new_id(), 30)  # expires unflipped: not shown
    clock.advance(timedelta(seconds=901))
    held = await _held(client, car, new_id(), 40)
    paid = await _held(client, car, new_id(), 50)
    w = await webhook(client, clock, paid["bookingId"], paid["depositAmount"])
    assert w.json() == {"result": "confirmed"}
    dropped = await _held(client, car, new_id(), 60)
    r = await client.post(f"/api/bookings/{dropped['bookingId']}/cancel", headers=ADMIN)
    assert r.json()["status"] == "CANCELLED"

    def period(b: dict[str, Any], status: str) -> dict[str, Any]:
        to = datetime.fromisoformat(b["to"])
        return {
            "bookingId": b["bookingId"],
            "from": b["from"],
            "to": b["to"],
            "bufferUntil": (to + timedelta(minutes=120)).isoformat().replace("+00:00", "Z"),
            "status": status,
        }

    mine = auth("host", host)

    async def calendar(start: datetime, end: datetime, who: dict[str, str] = mine) -> Any:
        r = await client.get(
            f"/api/cars/{car}/calendar",
            params={"from": start.isoformat(), "to": end.isoformat()},
            headers=who,
        )
        assert r.status_code == 200, r.text
        return r.json()

    body = await calendar(at(0), at(24 * 30))
    assert body["carId"] == car
    got = body["periods"]
    assert [p["bookingId"] for p in got] == [held["bookingId"], paid["bookingId"]]
    for p, (b, s) in zip(got, [(held, "HOLD"), (paid, "CONFIRMED")], strict=True):
        want = period(b, s)
        assert datetime.fromisoformat(p["bufferUntil"]) == datetime.fromisoformat(
            want["bufferUntil"]
        )
        assert datetime.fromisoformat(p["from"]) == datetime.fromisoformat(b["from"])
        assert datetime.fromisoformat(p["to"]) == datetime.fromisoformat(b["to"])
        assert (p["bookingId"], p["status"]) == (b["bookingId"], s)
    assert expired["bookingId"] not in [p["bookingId"] for p in got]
    # Half-open, buffer included: a window inside the buffer after `to` shows the
    # booking; one ending at its `from`, or starting at its buffer's end, does not.
    assert [p["bookingId"] for p in (await calendar(at(41.5), at(42)))["periods"]] == [
        held["bookingId"]
    ]
    assert (await calendar(at(39), at(40)))["periods"] == []
    assert (await calendar(at(43), at(44)))["periods"] == []
    # An admin sees it too; the window may lie in the past.
    assert (await calendar(at(0), at(24 * 30), ADMIN))["periods"] == got
    assert (await calendar(at(-24 * 300), at(0)))["periods"] == []


async def test_calendar_errors(client: httpx.AsyncClient) -> None:
    host = new_id()
    car = (await make_car(client, host=host))["id"]
    ok = {"from": at(1).isoformat(), "to": at(48).isoformat()}
    url = f"/api/cars/{car}/calendar"
    assert code(await client.get(url, params=ok)) == (401, "unauthenticated")
    for who in (auth("customer", host), auth("patient", host)):
        assert code(await client.get(url, params=ok, headers=who)) == (403, "forbidden")
    # Another host's car is answered as one that does not exist.
    r = await client.get(url, params=ok, headers=auth("host", new_id()))
    assert code(r) == (404, "car_not_found")
    for who in (ADMIN, auth("host", host)):
        r = await client.get(f"/api/cars/{2**62}/calendar", params=ok, headers=who)
        assert code(r) == (404, "car_not_found")
    mine = auth("host", host)
    for params in (
        {"from": ok["from"]},
        {"to": ok["to"]},
        {"from": ok["to"], "to": ok["from"]},
        {"from": ok["from"], "to": ok["from"]},
        {"from": at(0).isoformat(), "to": (at(0) + timedelta(days=366, minutes=1)).isoformat()},
        {"from": "2030-01-01T10:00:00", "to": "2030-01-02T10:00:00"},
        {"from": "0001-01-01T00:00:00+01:00", "to": "2030-01-02T10:00:00Z"},
        {"from": "2030-01-01T10:00:00Z", "to": "9999-12-31T23:00:00Z"},
        {"from": "tomorrow", "to": "later"},
    ):
        r = await client.get(url, params=params, headers=mine)
        assert code(r) == (422, "validation_error"), params
    r = await client.get(
        url,
        params={"from": at(0).isoformat(), "to": (at(0) + timedelta(days=366)).isoformat()},
        headers=mine,
    )
    assert r.status_code == 200


# -- GET /api/cars/{carId}/quote -----------------------------------------------------------------


async def test_quote_prices_and_availability(client: httpx.AsyncClient, clock: OffsetClock) -> None:
    car = (await make_car(client, price=10_000))["id"]
    anyone = auth("bettor", new_id())

    async def quote(start: datetime, end: datetime) -> Any:
        r = await client.get(
            f"/api/cars/{car}/quote",
            params={"from": start.isoformat(), "to": end.isoformat()},
            headers=anyone,
        )
        assert r.status_code == 200, r.text
        return r.json()

    start = at(30)
    q = await quote(start, start + timedelta(days=2, minutes=1))
    assert q == {
        "carId": car,
        "days": 3,
        "price": 30_000,
        "depositAmount": 9_000,
        "available": True,
    }
    # The deposit is what the hold then charges.
    r = await hold(client, car, new_id(), start, start + timedelta(days=2, minutes=1))
    assert r.json()["depositAmount"] == q["depositAmount"]
    end = start + timedelta(days=2, minutes=1)
    assert (await quote(start, start + timedelta(hours=1)))["available"] is False
    # The turnaround buffer blocks: starting at the trip's end is not available,
    # starting when its buffer ends is. A trip ending at its start is not (the new
    # trip's own buffer would overlap it); one ending 2 hours before it is.
    assert (await quote(end, end + timedelta(hours=5)))["available"] is False
    buffer_end = end + timedelta(minutes=120)
    assert (await quote(buffer_end, buffer_end + timedelta(hours=5)))["available"] is True
    assert (await quote(start - timedelta(hours=5), start))["available"] is False
    early = start - timedelta(hours=5, minutes=120)
    assert (await quote(early, start - timedelta(minutes=120)))["available"] is True
    # The hold expires (no job flips it): the car is available again.
    clock.advance(timedelta(seconds=901))
    assert (await quote(start, start + timedelta(hours=1)))["available"] is True


async def test_quote_errors(client: httpx.AsyncClient) -> None:
    car = (await make_car(client))["id"]
    ok = {"from": at(30).isoformat(), "to": at(40).isoformat()}
    url = f"/api/cars/{car}/quote"
    assert code(await client.get(url, params=ok)) == (401, "unauthenticated")
    anyone = auth("patient", new_id())
    r = await client.get(f"/api/cars/{2**62}/quote", params=ok, headers=anyone)
    assert code(r) == (404, "car_not_found")
    for params in (
        {"from": ok["from"]},
        {"from": ok["to"], "to": ok["from"]},
        {"from": ok["from"], "to": ok["from"]},
        {"from": at(-5).isoformat(), "to": at(5).isoformat()},  # in the past
        {"from": at(30).isoformat(), "to": (at(30) + timedelta(days=91)).isoformat()},
        {"from": "2030-01-01T10:00:00", "to": "2030-01-02T10:00:00"},
        {"from": "9999-12-31T23:00:00-05:00", "to": "9999-12-31T23:30:00-05:00"},
    ):
        r = await client.get(url, params=params, headers=anyone)
        assert code(r) == (422, "validation_error"), params
    r = await client.get("/api/cars/0/quote", params=ok, headers=anyone)
    assert code(r) == (422, "validation_error")


# -- the plans: page one million costs what page one costs ------------------------------------


@pytest.fixture
async def own(base_settings: Settings, own_database: str) -> AsyncIterator[Container]:
    c = build(base_settings.with_(database_url=own_database), OffsetClock())
    yield c
    await c.close()


# -- GET /api/cars: the search, a page at a time ------------------------------------------------


async def _search_pages(
    client: httpx.AsyncClient, city: str, start: datetime, end: datetime, limit: int
) -> list[list[dict[str, Any]]]:
    params: dict[str, Any] = {"city": city, "from": start.isoformat(), "to": end.isoformat()}
    pages, after = [], None
    while True:
        query = {**params, "limit": limit, **({"after": after} if after else {})}
        r = await client.get("/api/cars", params=query, headers=auth("customer", new_id()))
        assert r.status_code == 200, r.text
        body = r.json()
        assert set(body) == {"items", "next"}
        pages.append(body["items"])
        after = body["next"]
        if after is None:
            return pages
        assert len(pages) < 1000, "the walk does not end"


async def test_car_search_pages_cheapest_first_past_the_old_cap(
    client: httpx.AsyncClient, db: asyncpg.Connection
) -> None:
    """Every free car of the city, page by page (dailyPrice, then id), each once:
    also beyond the 500 the bare list stopped at. A busy car is on no page."""
    city = f"pages-{new_id()}"
    # 520 cars, prices in ties of four (so the id decides within a price).
    await db.execute(
        "INSERT INTO car (plate, model, city, daily_price, host_id, created_at)"
        " SELECT 'PG-' || $1 || '-' || g, 'M', $1, 1000 + (g % 130) * 10, 1, now()"
        "   FROM generate_series(1, 520) g",
        city,
    )
    busy = await make_car(client, city=city, price=1_000)
    start, end = at(300), at(348)
    assert (await hold(client, busy["id"], new_id(), start, end)).status_code == 201
    expected = [
        r["id"]
        for r in await db.fetch(
            "SELECT id FROM car WHERE city = $1 AND id <> $2 ORDER BY daily_price, id",
            city,
            busy["id"],
        )
    ]
    assert len(expected) == 520
    pages = await _search_pages(client, city, start, end, 200)
    assert [len(p) for p in pages] == [200, 200, 120]
    assert [c["id"] for p in pages for c in p] == expected
    small = await _search_pages(client, city, start, end, 7)
    assert [c["id"] for p in small for c in p] == expected
    # A page that ends exactly at the last car says so: no empty page after it.
    exact = await _search_pages(client, city, start, end, 130)
    assert [len(p) for p in exact] == [130, 130, 130, 130]


async def test_car_search_errors(client: httpx.AsyncClient) -> None:
    start, end = at(300), at(348)
    params = {"city": "Lisbon", "from": start.isoformat(), "to": end.isoformat()}
    who = auth("customer", new_id())
    for bad in (
        {"limit": 0},
        {"limit": 201},
        {"after": "not-a-cursor"},
        {"after": base64.urlsafe_b64encode(b"[1]").decode().rstrip("=")},
        {"after": base64.urlsafe_b64encode(b'["a", 1]').decode().rstrip("=")},
        {"after": base64.urlsafe_b64encode(b"[0, 0]").decode().rstrip("=")},
    ):
        r = await client.get("/api/cars", params={**params, **bad}, headers=who)
        assert code(r) == (422, "validation_error"), (bad, r.text)


async def test_plans_walk_an_index_without_sorting(own: Container) -> None:
    """With enough rows that the planner has a choice: a customer's list and the
    hold rate count walk booking_customer_created from the key and stop; the
    calendar reads the exclusion constraint's index. No Sort, no Seq Scan."""
    now = datetime.now(UTC)
    async with own.db.transaction() as conn:
        await conn.execute(
            "INSERT INTO car (plate, model, city, daily_price, host_id, created_at)"
            " SELECT 'PLAN-' || g, 'M', 'C', 100, 1, $1 FROM generate_series(1, 100) g",
            now,
        )
        car = await conn.fetchval("SELECT min(id) FROM car")
        # 200,000 bookings of 1,000 customers (customer 7: 2,000 of them), one live
        # per 3 hours on each car, the rest past.
        await conn.execute(
            "INSERT INTO booking (car_id, customer_id, period, return_at, status,"
            " deposit_amount, created_at, updated_at)"
            " SELECT $2 + g % 100, CASE WHEN g % 100 = 0 THEN 7 ELSE g % 1000 + 8 END,"
            "        tstzrange(t, t + interval '2 hours'), t + interval '1 hour',"
            "        CASE WHEN g % 10 = 0 THEN 'CONFIRMED' ELSE 'COMPLETED' END, 0,"
            "        $1::timestamptz - g * interval '1 minute', $1"
            "   FROM generate_series(1, 200000) g,"
            "        LATERAL (SELECT $1::timestamptz + (g / 100) * interval '3 hours' AS t) x",
            now,
            car,
        )
        # Cars of 200 cities besides: the search walks one city's (price, id) range.
        await conn.execute(
            "INSERT INTO car (plate, model, city, daily_price, host_id, created_at)"
            " SELECT 'CITY-' || g, 'M', 'city-' || g % 200, 100 + g % 97, 1, $1"
            "   FROM generate_series(1, 40000) g",
            now,
        )
        await conn.execute("ANALYZE booking")
        await conn.execute("ANALYZE car")
    from reservo.rentals.repo import Q

    key = (now - timedelta(days=30), 10**6)
    window = f"tstzrange('{now.isoformat()}', '{(now + timedelta(days=60)).isoformat()}')"
    plans = {
        "list": (Q.customer_bookings, [7, *key, 51], "booking_customer_created"),
        "list_by_status": (
            Q.customer_bookings_by_status,
            [7, *key, 51, "CONFIRMED", now],
            "booking_customer_created",
        ),
        "rate": (Q.recent_holds, [7, now - timedelta(minutes=15), 3], "booking_customer_created"),
        "calendar": (Q.car_calendar, [car, window, now], "ex_car_period"),
        "search": (Q.search_available, ["city-7", window, now, 51, 150, 9000], "car_city"),
    }
    async with own.db.connection() as conn:
        for name, (sql, args, index) in plans.items():
            for mode, plan in (await plans_of(conn, name, sql, args)).items():
                assert index in plan, (name, mode, plan)
                assert "Seq Scan" not in plan, (name, mode, plan)
                if name == "list_by_status":
                    # Status is not indexed: a rare status reads the customer's
                    # bookings, through the index, and the planner may sort
                    # those (one customer's); never the table.
                    continue
                if name != "calendar":  # the calendar sorts the window's few periods
                    assert "Sort" not in plan and "Bitmap" not in plan, (name, mode, plan)


# -- the contract in the OpenAPI document -------------------------------------------------------


async def test_openapi_documents_the_new_endpoints(client: httpx.AsyncClient) -> None:
    doc = (await client.get("/openapi.json")).json()
    paths, schemas = doc["paths"], doc["components"]["schemas"]

    def ok_schema(op: dict[str, Any]) -> str:
        ref: str = op["responses"]["200"]["content"]["application/json"]["schema"]["$ref"]
        return ref.rsplit("/", 1)[1]

    # Each operation lists the statuses it can answer, and only those.
    ops = {
        "/api/customers/{customerId}/bookings": ("BookingPage", {"401", "403", "422"}),
        "/api/cars/{carId}/calendar": ("Calendar", {"401", "403", "404", "422"}),
        "/api/cars/{carId}/quote": ("QuoteOut", {"401", "404", "422"}),
        "/api/cars": ("CarPage", {"401", "422"}),
    }
    for path, (schema, statuses) in ops.items():
        op = paths[path]["get"]
        assert ok_schema(op) == schema
        errors = {s for s in op["responses"] if int(s) >= 400}
        # 503 unavailable: on every operation.
        assert errors - {"503"} == statuses, (path, errors)
    assert set(schemas["BookingPage"]["properties"]) == {"items", "next"}
    assert set(schemas["CalendarPeriod"]["properties"]) == {
        "bookingId",
        "from",
        "to",
        "bufferUntil",
        "status",
    }
    assert set(schemas["Calendar"]["properties"]) == {"carId", "periods"}
    assert set(schemas["QuoteOut"]["properties"]) == {
        "carId",
        "days",
        "price",
        "depositAmount",
        "available",
    }
    params = {p["name"] for p in paths["/api/customers/{customerId}/bookings"]["get"]["parameters"]}
    assert {"customerId", "status", "limit", "after"} <= params
    assert set(schemas["CarPage"]["properties"]) == {"items", "next"}
    params = {p["name"] for p in paths["/api/cars"]["get"]["parameters"]}
    assert params == {"city", "from", "to", "limit", "after"}
