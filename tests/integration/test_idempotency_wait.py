"""A retry that overtakes the first request waits for its answer, on every
route that creates something (docs/DESIGN.md, "Waiting for a request in
flight").

Twenty requests with one Idempotency-Key are released together (a barrier)
across two API processes (two apps, each with its own pool, batchers and
booking turns, on the same PostgreSQL and Redis, as a deployment runs them),
fresh or after a first attempt that died with its claim (the retries then race
to take it over): one thing is created, one request answers 201 and the
nineteen others 200 with the same body; none is 409 while the first one runs
within the wait. The pools are small on purpose: a waiter that held a
connection while it waits would leave the first request none. Past the wait,
409 ``request_in_progress`` with Retry-After, and a marker left by a request
that died never holds a retry longer than the wait."""

from __future__ import annotations

import asyncio
import time
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import AsyncExitStack, asynccontextmanager
from dataclasses import dataclass, field
from typing import Any

import asyncpg
import httpx
import orjson
import pytest
from prometheus_client import REGISTRY

from reservo.app import create_app
from reservo.bootstrap import Container, build
from reservo.core.http.idempotency import Claim
from reservo.core.kernel.clock import OffsetClock
from reservo.settings import Settings
from tests.helpers.appointments import make_slots
from tests.helpers.auth import SERVICE, auth, new_id
from tests.helpers.betting import ODDS, make_account, make_match
from tests.helpers.http import problem, together
from tests.helpers.rentals import at, make_car

RETRIES = 20
# Small pools: twenty waiters per process cannot each hold a connection.
POOL = {"db_pool_min": 1, "db_pool_max": 3}
# The wait of the tests that outlast it.
WAIT_MS = 400


@dataclass
class Processes:
    """Two API processes' clients, and the first one's container."""

    clients: tuple[httpx.AsyncClient, httpx.AsyncClient]
    container: Container

    async def twenty(
        self, path: str, body: dict[str, Any], headers: dict[str, str]
    ) -> list[httpx.Response]:
        """RETRIES identical requests, alternately to either process, released together."""

        def one(i: int) -> Awaitable[httpx.Response]:
            return self.clients[i % 2].post(path, json=body, headers=headers)

        return await together(RETRIES, one)


async def _processes(settings: Settings, clock: OffsetClock) -> AsyncIterator[Processes]:
    async with AsyncExitStack() as stack:
        clients = []
        containers = []
        for _ in range(2):
            container = build(settings, clock)
            stack.push_async_callback(container.close)
            app = create_app(container, owns_container=False)
            client = httpx.AsyncClient(
                transport=httpx.ASGITransport(app=app), base_url="http://reservo.test"
            )
            await stack.enter_async_context(client)
            clients.append(client)
            containers.append(container)
        yield Processes((clients[0], clients[1]), containers[0])


@pytest.fixture
async def two(base_settings: Settings, clock: OffsetClock) -> AsyncIterator[Processes]:
    # A per-patient booking limit that lets one patient's twenty retries through.
    settings = base_settings.with_(appointments_booking_rate_limit=1000, **POOL)
    async for processes in _processes(settings, clock):
        yield processes


@pytest.fixture
async def brief(base_settings: Settings, clock: OffsetClock) -> AsyncIterator[Processes]:
    """Two processes that wait WAIT_MS for a request in flight."""
    async for processes in _processes(base_settings.with_(idempotency_wait_ms=WAIT_MS), clock):
        yield processes


def one_created(responses: list[httpx.Response]) -> dict[str, Any]:
    """One 201 and every other answer the 200 replay of its body: no 409."""
    statuses = sorted(r.status_code for r in responses)
    assert statuses == [200] * (RETRIES - 1) + [201], [(r.status_code, r.text) for r in responses]
    created: dict[str, Any] = next(r.json() for r in responses if r.status_code == 201)
    assert all(r.json() == created for r in responses)
    return created


@dataclass
class Create:
    """One kind of create as a client sends it, and what it made in the database."""

    path: str
    body: dict[str, Any]
    role: str
    sub: int  # the caller, whose keys these are
    endpoint: str  # what its key is stored under
    made: Callable[[asyncpg.Connection], Awaitable[list[int]]]  # the ids it created
    id_field: str = "id"
    key: str = field(default_factory=lambda: f"retried-{uuid.uuid4()}")

    @property
    def headers(self) -> dict[str, str]:
        return {**auth(self.role, self.sub), "Idempotency-Key": self.key}


def _ids(sql: str, *args: Any) -> Callable[[asyncpg.Connection], Awaitable[list[int]]]:
    async def made(db: asyncpg.Connection) -> list[int]:
        return [r[0] for r in await db.fetch(sql, *args)]

    return made


async def _appointment(client: httpx.AsyncClient) -> Create:
    _, slots = await make_slots(client, capacity=5)
    slot, patient = slots[0]["id"], new_id()
    return Create(
        "/api/appointments",
        {"slotId": slot, "patientId": patient},
        "patient",
        patient,
        "POST /api/appointments",
        _ids("SELECT id FROM appointment WHERE patient_id = $1", patient),
    )


async def _rental(client: httpx.AsyncClient) -> Create:
    car, customer = await make_car(client), new_id()
    body = {
        "carId": car["id"],
        "customerId": customer,
        "from": at(48).isoformat(),
        "to": at(72).isoformat(),
    }
    return Create(
        "/api/bookings",
        body,
        "customer",
        customer,
        "POST /api/bookings",
        _ids("SELECT id FROM booking WHERE car_id = $1", car["id"]),
        "bookingId",
    )


async def _deposit(client: httpx.AsyncClient) -> Create:
    account, _ = await make_account(client, 0)
    path = f"/api/accounts/{account}/deposits"
    return Create(
        path,
        {"amount": 250, "reference": f"ref-{uuid.uuid4()}"},
        "service",
        1,
        f"POST {path}",
        _ids("SELECT id FROM wallet_transfer WHERE to_account_id = $1", account),
    )


async def _transfer(client: httpx.AsyncClient) -> Create:
    source, owner = await make_account(client, 1_000)
    target, _ = await make_account(client, 0)
    return Create(
        "/api/transfers",
        {"fromAccountId": source, "toAccountId": target, "amount": 70},
        "bettor",
        owner,
        "POST /api/transfers",
        _ids(
            "SELECT id FROM wallet_transfer WHERE from_account_id = $1 AND kind = 'TRANSFER'",
            source,
        ),
    )


async def _bet(client: httpx.AsyncClient) -> Create:
    account, owner = await make_account(client, 1_000)
    match = await make_match(client)
    pick = {"matchId": match["id"], "market": "1X2", "pick": "HOME", "odds": ODDS["1X2"]["HOME"]}
    return Create(
        "/api/bets",
        {"accountId": account, "stake": 100, "selections": [pick]},
        "bettor",
        owner,
        "POST /api/bets",
        _ids("SELECT id FROM betting_bet WHERE account_id = $1", account),
    )


async def _job(client: httpx.AsyncClient) -> Create:
    marker = str(uuid.uuid4())
    body = {
        "category": "http",
        "delayMs": 3_600_000,
        "payload": {"url": "https://callbacks.example.com/hook", "body": {"m": marker}},
    }
    return Create(
        "/api/jobs",
        body,
        "service",
        1,
        "POST /api/jobs",
        _ids("SELECT id FROM scheduled_job WHERE payload->'body'->>'m' = $1", marker),
        "jobId",
    )


CREATES = {
    "appointment booking": _appointment,
    "rental booking": _rental,
    "deposit": _deposit,
    "transfer": _transfer,
    "bet": _bet,
    "job": _job,
}


@pytest.mark.parametrize("kind", list(CREATES))
@pytest.mark.parametrize("first", ["fresh", "after a dead attempt"])
async def test_twenty_retries_with_one_key_create_once_and_all_get_its_answer(
    two: Processes, db: asyncpg.Connection, database_url: str, kind: str, first: str
) -> None:
    """Fresh: twenty requests, none of which ran before. After a dead attempt:
    a first attempt claimed the key and died (its claim left IN_PROGRESS, its
    lease run out), then the client's twenty retries race to take it over; the
    claim's row is held locked while they arrive, so that they all meet it
    before any of them took it over (a busy database). One takes it over and
    creates, the others wait for it: before, each that lost the race was 409,
    on the one-request flow and on a group commit alike."""
    create = await CREATES[kind](two.clients[0])
    expired = waits("expired")
    if first == "fresh":
        responses = await two.twenty(create.path, create.body, create.headers)
    else:
        claim = await two.container.idempotency.begin(
            str(create.sub), create.endpoint, create.key, orjson.dumps(create.body)
        )
        assert isinstance(claim, Claim)
        await db.execute(
            "UPDATE idempotency_key SET locked_until = locked_until - interval '1 hour'"
            " WHERE key = $1",
            create.key,
        )
        async with _row_locked(database_url, create.key):
            retries = asyncio.create_task(two.twenty(create.path, create.body, create.headers))
            await asyncio.sleep(0.3)
        responses = await retries
    created = one_created(responses)
    assert waits("expired") == expired
    assert await create.made(db) == [created[create.id_field]]
    stored = await db.fetchrow(
        "SELECT status, response_status FROM idempotency_key WHERE key = $1", create.key
    )
    assert tuple(stored) == ("DONE", 201)


@asynccontextmanager
async def _row_locked(database_url: str, key: str) -> AsyncIterator[None]:
    """The key's row locked (FOR UPDATE) by another transaction while inside."""
    conn = await asyncpg.connect(database_url)
    try:
        async with conn.transaction():
            await conn.execute("SELECT 1 FROM idempotency_key WHERE key = $1 FOR UPDATE", key)
            yield
    finally:
        await conn.close()


def waits(outcome: str) -> float:
    """reservo_idempotency_waits_total{outcome} of this test process."""
    return REGISTRY.get_sample_value("reservo_idempotency_waits_total", {"outcome": outcome}) or 0.0


async def _claimed(db: asyncpg.Connection, key: str) -> None:
    """Until the first request's claim on ``key`` is committed IN_PROGRESS."""
    for _ in range(500):
        if (
            await db.fetchval("SELECT status FROM idempotency_key WHERE key = $1", key)
            == "IN_PROGRESS"
        ):
            return
        await asyncio.sleep(0.01)
    raise AssertionError(f"no claim on {key}")


async def _timed(call: Callable[[], Awaitable[httpx.Response]]) -> tuple[httpx.Response, float]:
    started = time.monotonic()
    response = await call()
    return response, time.monotonic() - started


async def test_past_the_wait_a_retry_is_409_and_then_gets_the_answer(
    brief: Processes, database_url: str, db: asyncpg.Connection
) -> None:
    """A first deposit held up (its account row locked by another transaction)
    outlasts the wait: the retry (in the other process) waited the whole wait,
    then is 409 request_in_progress with Retry-After; another body under the
    key is 422 at once; once the first ends, a retry gets its answer."""
    a, b = brief.clients
    account, _ = await make_account(a, 0)
    key = f"slow-{uuid.uuid4()}"
    headers = {**SERVICE, "Idempotency-Key": key}
    body = {"amount": 40, "reference": f"ref-{uuid.uuid4()}"}
    path = f"/api/accounts/{account}/deposits"
    holder = await asyncpg.connect(database_url)
    try:
        hold = holder.transaction()
        await hold.start()
        await holder.execute("SELECT 1 FROM wallet_account WHERE id = $1 FOR UPDATE", account)
        first = asyncio.create_task(a.post(path, json=body, headers=headers))
        await _claimed(db, key)
        expired = waits("expired")
        retry, waited = await _timed(lambda: b.post(path, json=body, headers=headers))
        assert waits("expired") == expired + 1
        problem(retry, 409, "request_in_progress")
        assert retry.headers["retry-after"] == "1"
        assert waited >= WAIT_MS / 1000
        assert waited < WAIT_MS / 1000 + 2  # no longer than the wait (and a loaded machine)
        other = {**body, "amount": 41}
        reused, took = await _timed(lambda: b.post(path, json=other, headers=headers))
        problem(reused, 422, "idempotency_key_reused")
        assert took < WAIT_MS / 1000  # another body is refused without waiting
        assert not first.done()
        await hold.rollback()
    finally:
        await holder.close()
    created = await first
    assert created.status_code == 201, created.text
    late = await b.post(path, json=body, headers=headers)
    assert (late.status_code, late.json()) == (200, created.json())
    assert await db.fetchval("SELECT balance FROM wallet_account WHERE id = $1", account) == 40


@pytest.mark.parametrize("route", ["rental booking", "transfer"])
async def test_a_claim_left_by_a_dead_request_holds_a_retry_no_longer_than_the_wait(
    brief: Processes, db: asyncpg.Connection, route: str
) -> None:
    """A first request that died left its claim (IN_PROGRESS, its lease still
    running): a retry waits the wait, not the lease, and is 409 with
    Retry-After; on the one-request flow and on a group commit alike."""
    client = brief.clients[1]
    if route == "transfer":
        source, owner = await make_account(client, 100)
        target, _ = await make_account(client, 0)
        caller, path, endpoint = str(owner), "/api/transfers", "POST /api/transfers"
        body: dict[str, Any] = {"fromAccountId": source, "toAccountId": target, "amount": 5}
        role = "bettor"
    else:
        car, customer = await make_car(client), new_id()
        caller, path, endpoint = str(customer), "/api/bookings", "POST /api/bookings"
        body = {
            "carId": car["id"],
            "customerId": customer,
            "from": at(48).isoformat(),
            "to": at(72).isoformat(),
        }
        role = "customer"
    key = f"dead-{uuid.uuid4()}"
    claim = await brief.container.idempotency.begin(caller, endpoint, key, orjson.dumps(body))
    assert isinstance(claim, Claim)
    headers = {**auth(role, int(caller)), "Idempotency-Key": key}
    retry, waited = await _timed(lambda: client.post(path, json=body, headers=headers))
    problem(retry, 409, "request_in_progress")
    assert retry.headers["retry-after"] == "1"
    assert WAIT_MS / 1000 <= waited < WAIT_MS / 1000 + 2
