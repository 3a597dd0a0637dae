"""The car search cache (GET /api/cars): a repeated search within its TTL is
served from Redis without a statement to PostgreSQL, page by page; a hold drops
the cached pages of its city over the days it covers, so the next search, in
this process or another, no longer lists the car. Statements are counted on the
app's real pool (tests/helpers/statements.py). Each test runs on a single
Redis and on a Redis Cluster (a page and its days' generations share a slot)."""

from __future__ import annotations

from collections.abc import AsyncIterator
from datetime import datetime
from typing import Any

import httpx
import pytest

from reservo.app import create_app
from reservo.bootstrap import Container, build
from reservo.core.kernel.clock import OffsetClock
from reservo.settings import Settings
from tests.helpers.auth import auth, new_id
from tests.helpers.rentals import at, hold, make_car
from tests.helpers.statements import Statements

# The search statement (rentals/queries.sql, search_available).
SEARCH = "WHERE c.city = $1"

pytestmark = pytest.mark.redis_cluster


@pytest.fixture
async def second(
    base_settings: Settings, clock: OffsetClock
) -> AsyncIterator[tuple[httpx.AsyncClient, Container]]:
    """Another API process on the same PostgreSQL and Redis, without a copy of
    its own in front of Redis: each of its searches reads Redis."""
    c = build(base_settings.with_(rentals_search_local_ttl_s=0), clock)
    transport = httpx.ASGITransport(app=create_app(c, owns_container=False))
    async with httpx.AsyncClient(transport=transport, base_url="http://reservo.test") as client:
        yield client, c
    await c.close()


async def _page(
    client: httpx.AsyncClient,
    city: str,
    start: datetime,
    end: datetime,
    limit: int = 50,
    after: str | None = None,
) -> dict[str, Any]:
    query: dict[str, Any] = {
        "city": city,
        "from": start.isoformat(),
        "to": end.isoformat(),
        "limit": limit,
        **({"after": after} if after else {}),
    }
    r = await client.get("/api/cars", params=query, headers=auth("customer", new_id()))
    assert r.status_code == 200, r.text
    body: dict[str, Any] = r.json()
    return body


def _reads(statements: Statements) -> int:
    """The searches that reached PostgreSQL since the last call."""
    return sum(SEARCH in q for q in statements.take())


async def test_a_repeated_search_within_its_ttl_does_not_reach_postgresql(
    client: httpx.AsyncClient, second: tuple[httpx.AsyncClient, Container]
) -> None:
    reader, container = second
    city = f"cache-{new_id()}"
    cars = [await make_car(client, city=city, price=p) for p in (1_000, 2_000, 3_000)]
    start, end = at(200), at(248)
    statements = Statements(container)

    first = await _page(reader, city, start, end, limit=2)
    assert [c["id"] for c in first["items"]] == [cars[0]["id"], cars[1]["id"]]
    assert _reads(statements) == 1
    again = await _page(reader, city, start, end, limit=2)
    assert again == first
    assert statements.take() == [], "a repeated search reached PostgreSQL"
    # Each page is cached on its own.
    nxt = await _page(reader, city, start, end, limit=2, after=first["next"])
    assert [c["id"] for c in nxt["items"]] == [cars[2]["id"]]
    assert _reads(statements) == 1
    assert await _page(reader, city, start, end, limit=2, after=first["next"]) == nxt
    assert statements.take() == [], "a repeated page reached PostgreSQL"


async def test_a_hold_drops_the_cached_search_of_its_city_and_days(
    client: httpx.AsyncClient, second: tuple[httpx.AsyncClient, Container]
) -> None:
    reader, container = second
    city = f"cache-{new_id()}"
    taken = await make_car(client, city=city, price=1_000)
    free = await make_car(client, city=city, price=2_000)
    both = [taken["id"], free["id"]]
    start, end = at(200), at(248)  # the hold's days
    later, later_end = at(400), at(424)  # days the hold does not touch
    statements = Statements(container)
    for searcher in (client, reader):  # cached in Redis and in this process's copy
        assert [c["id"] for c in (await _page(searcher, city, start, end))["items"]] == both
        assert [c["id"] for c in (await _page(searcher, city, later, later_end))["items"]] == both
    statements.take()
    await _page(reader, city, start, end)
    assert statements.take() == [], "not cached before the hold"

    assert (await hold(client, taken["id"], new_id(), start, end)).status_code == 201

    # The next search, in another process and in the one that held, shows it
    # gone: the first reads PostgreSQL again, the second finds that fresh page.
    assert [c["id"] for c in (await _page(reader, city, start, end))["items"]] == [free["id"]]
    assert _reads(statements) == 1
    assert [c["id"] for c in (await _page(client, city, start, end))["items"]] == [free["id"]]
    # The pages of other days stay cached.
    assert [c["id"] for c in (await _page(reader, city, later, later_end))["items"]] == both
    assert statements.take() == [], "a hold dropped pages of days it does not cover"
