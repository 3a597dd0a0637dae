"""The booking gate after Redis lost its state (a flush, a restart without
persistence, a cluster node emptied): a retry of a booking that reached the
database gets its stored answer even when the slot's full mark is back before
the key's seen mark, and in the steady state a full slot's refusals still
need no PostgreSQL.

A single Redis that loses its state is a private redis-server of the test
(flushed, or restarted: it keeps nothing); the Redis Cluster runs lose the
keys of this test's namespace on the node that holds the retried key's mark,
which is what that node's restart would lose of them."""

from __future__ import annotations

import contextlib
import uuid
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from urllib.parse import urlsplit

import asyncpg
import httpx
import pytest
import redis.asyncio

from reservo.app import create_app
from reservo.appointments.gate import BUCKETS, full_key, repair_key, request_key, seen_key
from reservo.appointments.setup import Appointments
from reservo.bootstrap import Container, build
from reservo.core.kernel.clock import OffsetClock
from reservo.settings import Settings
from tests.helpers.appointments import book, make_slots
from tests.helpers.auth import new_id
from tests.helpers.http import codes, together
from tests.helpers.procs import free_port
from tests.helpers.proxy import TcpProxy
from tests.helpers.scheduler import OwnRedis, own_redis
from tests.helpers.waiting import wait_until
from tests.integration.test_resilience import behind_proxy
from tests.redis_cluster import RedisTarget


@asynccontextmanager
async def app_client(container: Container) -> AsyncIterator[httpx.AsyncClient]:
    app = create_app(container, owns_container=False)
    transport = httpx.ASGITransport(app=app)
    async with httpx.AsyncClient(transport=transport, base_url="http://reservo.test") as c:
        yield c


@asynccontextmanager
async def stack(
    settings: Settings, clock: OffsetClock
) -> AsyncIterator[tuple[httpx.AsyncClient, Container]]:
    container = build(settings, clock)
    try:
        async with app_client(container) as client:
            yield client, container
    finally:
        await container.close()


def _on_own_redis(base: Settings, own: OwnRedis) -> Settings:
    return base.with_(redis_url=own.url, redis_cluster=False)


async def _whole(container: Container) -> bool:
    return await container.module(Appointments).service.key_marks.whole()


async def _lose_own(own: OwnRedis, how: str) -> None:
    """The private Redis loses everything: FLUSHALL, or a restart (no persistence)."""
    if how == "flush":
        r = redis.asyncio.Redis.from_url(own.url)
        try:
            assert await r.flushall()
        finally:
            await r.aclose()
    else:
        own.stop()
        own.start()


async def _hold_repairs(
    client: redis.asyncio.Redis | redis.asyncio.RedisCluster, container: Container
) -> None:
    """Another process holds every group's repair lease (its repair is slow):
    until it is done, the gate may not trust a missing seen mark."""
    for b in range(BUCKETS):
        assert await client.set(
            container.cache.mark_key(repair_key(b)), b"elsewhere", nx=True, px=60_000
        )


async def _full_again(client: httpx.AsyncClient, container: Container, slot: int) -> None:
    """Another patient's attempt is refused by the database, which marks the
    slot full in Redis again (after a restart, once the app's Redis client is
    past its backoff)."""

    async def refused_and_marked() -> bool:
        r = await book(client, slot, new_id())
        assert (r.status_code, r.json()["code"]) == (409, "slot_full"), r.text
        return await container.cache.is_marked(full_key(slot))

    await wait_until(refused_and_marked, what="the slot's full mark set again")


async def _repaired(client: httpx.AsyncClient, container: Container, slot: int) -> None:
    """The gate's attempts start the repair of its marks (one at a time per
    process, a pause apart): refused attempts on the full slot until it is done."""

    async def whole() -> bool:
        await _full_again(client, container, slot)
        return await _whole(container)

    await wait_until(whole, what="the gate's marks repaired")


async def _fill(client: httpx.AsyncClient, capacity: int) -> tuple[int, int, str, httpx.Response]:
    """A slot of ``capacity`` seats: one patient books with a key of their
    own, others fill the rest. The slot, the patient, the key, their 201."""
    _, slots = await make_slots(client, capacity=capacity)
    slot, patient, key = slots[0]["id"], new_id(), f"k-{uuid.uuid4()}"
    first = await book(client, slot, patient, key)
    assert first.status_code == 201, first.text
    for _ in range(capacity - 1):
        assert (await book(client, slot, new_id())).status_code == 201
    return slot, patient, key, first


async def _booked(db: asyncpg.Connection, slot: int) -> int:
    n: int = await db.fetchval(
        "SELECT count(*) FROM appointment WHERE slot_id = $1 AND status = 'BOOKED'", slot
    )
    return n


@pytest.mark.parametrize("repair", ["done_before_the_retry", "under_way_elsewhere"])
@pytest.mark.parametrize("loss", ["flush", "restart"])
async def test_a_replay_after_redis_lost_its_marks_gets_its_stored_answer(
    base_settings: Settings, clock: OffsetClock, db: asyncpg.Connection, loss: str, repair: str
) -> None:
    """Issue 39, item 2: booked with key K, slot filled, Redis lost everything,
    another attempt marks the slot full again: the retry with K gets its 201
    replayed as 200, whether the gate's marks were rebuilt first or not yet."""
    with own_redis() as own:
        async with stack(_on_own_redis(base_settings, own), clock) as (client, container):
            slot, patient, key, first = await _fill(client, 5)
            await wait_until(lambda: _whole(container), what="the gate's marks whole")

            await _lose_own(own, loss)
            if repair == "under_way_elsewhere":
                raw = redis.asyncio.Redis.from_url(own.url)
                try:
                    await _hold_repairs(raw, container)
                finally:
                    await raw.aclose()
            await _full_again(client, container, slot)
            if repair == "done_before_the_retry":
                await _repaired(client, container, slot)
            else:
                assert not await _whole(container)

            again = await book(client, slot, patient, key)
            assert (again.status_code, again.json()) == (200, first.json()), again.text
            assert await _booked(db, slot) == 5
            # Not a way past the full mark: a new attempt of the same patient is refused.
            other = await book(client, slot, patient)
            assert (other.status_code, other.json()["code"]) == (409, "slot_full")


async def _lose_node_of(target: RedisTarget, container: Container, rkey: str) -> None:
    """The node holding ``rkey``'s seen mark loses this test's keys (on a single
    Redis: all of them), as its restart without persistence would."""
    raw = target.client(5.0)
    try:
        mark = container.cache.mark_key(seen_key(rkey))
        assert await raw.exists(mark)
        ns = container.settings.redis_namespace
        keys = [k async for k in raw.scan_iter(match=f"{ns}:*", count=1000)]
        if isinstance(raw, redis.asyncio.RedisCluster):
            node = raw.get_node_from_key(mark)
            keys = [k for k in keys if raw.get_node_from_key(k) == node]
        for k in keys:
            await raw.delete(k)
        assert not await raw.exists(mark)
    finally:
        await raw.aclose()


@pytest.mark.redis_cluster
@pytest.mark.parametrize("repair", ["done_before_the_retry", "under_way_elsewhere"])
async def test_a_replay_after_a_redis_node_lost_its_marks_gets_its_stored_answer(
    base_settings: Settings,
    redis_target: RedisTarget,
    clock: OffsetClock,
    db: asyncpg.Connection,
    repair: str,
) -> None:
    """The same on a single Redis and a Redis Cluster, whose node holding the
    key's seen mark lost it (and the group's whole mark beside it)."""
    async with stack(base_settings.with_(redis_timeout_s=2.0), clock) as (client, container):
        slot, patient, key, first = await _fill(client, 5)
        await wait_until(lambda: _whole(container), what="the gate's marks whole")

        await _lose_node_of(redis_target, container, request_key(str(patient), key))
        if repair == "under_way_elsewhere":
            raw = redis_target.client(5.0)
            try:
                await _hold_repairs(raw, container)  # NX: a group still whole has no lease taken
            finally:
                await raw.aclose()
        await _full_again(client, container, slot)
        if repair == "done_before_the_retry":
            await _repaired(client, container, slot)

        again = await book(client, slot, patient, key)
        assert (again.status_code, again.json()) == (200, first.json()), again.text
        assert await _booked(db, slot) == 5
        # The namespace is the session's: the next test must find no lease held.
        raw = redis_target.client(5.0)
        try:
            for b in range(BUCKETS):
                await raw.delete(container.cache.mark_key(repair_key(b)))
        finally:
            await raw.aclose()


async def test_a_full_slot_asks_postgres_only_while_the_marks_are_not_whole(
    base_settings: Settings, clock: OffsetClock
) -> None:
    """The steady state: a storm on a full slot is refused with PostgreSQL cut
    (no refusal reaches it). After Redis lost its state and before the marks
    are repaired, such an attempt may be a replay, so it asks PostgreSQL (503
    while it is away). Once repaired, the storm needs no PostgreSQL again."""
    with own_redis() as own:
        async with (
            behind_proxy(base_settings, clock, redis_url=own.url, redis_cluster=False) as (
                proxy,
                container,
            ),
            app_client(container) as client,
        ):
            slot, _, _, _ = await _fill(client, 1)
            await wait_until(lambda: _whole(container), what="the gate's marks whole")
            await _full_again(client, container, slot)

            async def back(proxy: TcpProxy) -> None:
                await proxy.start()

                async def ready() -> bool:
                    return (await client.get("/readyz")).status_code == 200

                await wait_until(ready, what="PostgreSQL reachable again")

            async def storm() -> None:
                responses = await together(30, lambda i: book(client, slot, new_id()))
                assert codes(responses) == {(409, "slot_full"): 30}

            await proxy.stop()
            await storm()
            await back(proxy)

            await _lose_own(own, "flush")
            raw = redis.asyncio.Redis.from_url(own.url)
            try:
                await _hold_repairs(raw, container)
                await _full_again(client, container, slot)
                await proxy.stop()
                asked = await book(client, slot, new_id())
                assert (asked.status_code, asked.json()["code"]) == (503, "unavailable"), asked.text
                await back(proxy)
                # The slow repair elsewhere gave up (its leases expired): this
                # process repairs the marks on its next refusal.
                await raw.delete(*(container.cache.mark_key(repair_key(b)) for b in range(BUCKETS)))
            finally:
                await raw.aclose()

            await _repaired(client, container, slot)
            await proxy.stop()
            await storm()
            await back(proxy)


async def test_a_replay_of_a_booking_made_while_redis_was_unreachable_gets_its_answer(
    base_settings: Settings, clock: OffsetClock, db: asyncpg.Connection
) -> None:
    """Redis unreachable (not emptied) while a booking goes through: the gate
    fails open, the database books, and the key's seen mark never reaches
    Redis. Redis is back with everything else it had, and the slot fills:
    the retry of that booking still gets its stored answer."""
    upstream = urlsplit(base_settings.redis_url or "")
    proxy = TcpProxy(free_port(), (upstream.hostname or "127.0.0.1", upstream.port or 6379))
    await proxy.start()
    try:
        settings = base_settings.with_(
            redis_url=f"redis://127.0.0.1:{proxy.port}{upstream.path}",
            redis_cluster=False,
            redis_backoff_s=0.2,
        )
        async with stack(settings, clock) as (client, container):
            _, slots = await make_slots(client, capacity=2)
            slot, patient, key = slots[0]["id"], new_id(), f"k-{uuid.uuid4()}"
            assert (await book(client, slots[1]["id"], new_id())).status_code == 201
            await wait_until(lambda: _whole(container), what="the gate's marks whole")

            await proxy.stop()
            first = await book(client, slot, patient, key)
            assert first.status_code == 201, first.text
            await proxy.start()
            assert (await book(client, slot, new_id())).status_code == 201
            await _full_again(client, container, slot)

            again = await book(client, slot, patient, key)
            assert (again.status_code, again.json()) == (200, first.json()), again.text
            assert await _booked(db, slot) == 2
    finally:
        with contextlib.suppress(AssertionError):
            await proxy.stop()
