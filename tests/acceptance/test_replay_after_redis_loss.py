"""An Idempotency-Key's replay survives the loss of everything Redis held and a
restart of every process (docs/OPERATIONS.md: PostgreSQL is the truth, Redis a
filter and cache): the retry gets the stored answer, 200 with the same body.

On a private redis-server the test flushes (never the shared one), with
`reservo api --workers 2` and `reservo worker` restarted after the flush. The
second case is the patient's retry on a slot that has filled meanwhile: another
patient's attempt after the flush marks the slot full in Redis, and the retry
must still be the stored booking, not 409 slot_full."""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import Iterator

import httpx
import pytest
import redis.asyncio as aioredis

from tests.helpers.appointments import book, make_slots
from tests.helpers.auth import new_id
from tests.helpers.deployment import Deploy, Deployment
from tests.helpers.scheduler import OwnRedis, own_redis

CAPACITY = 5


@pytest.fixture(scope="module")
def private_redis() -> Iterator[OwnRedis]:
    with own_redis() as redis:
        yield redis


@pytest.fixture(scope="module")
async def split(deploy: Deploy, private_redis: OwnRedis) -> Deployment:
    return await deploy("split", redis_url=private_redis.url)


async def _flush_and_restart(redis: OwnRedis, deployment: Deployment) -> None:
    client = aioredis.from_url(redis.url)
    try:
        await client.flushall()
        assert await client.dbsize() == 0
    finally:
        await client.aclose()
    await asyncio.to_thread(deployment.restart)


@pytest.mark.parametrize("slot_filled", [False, True], ids=["slot-open", "slot-filled"])
async def test_a_replay_after_a_redis_flush_and_a_restart_is_the_stored_answer(
    split: Deployment, private_redis: OwnRedis, slot_filled: bool
) -> None:
    async with httpx.AsyncClient(base_url=split.url, timeout=30) as http:
        _, slots = await make_slots(http, capacity=CAPACITY, days_ahead=3)
        slot = slots[0]["id"]
        patient, key = new_id(), str(uuid.uuid4())
        first = await book(http, slot, patient, key)
        assert first.status_code == 201, first.text
        if slot_filled:
            for _ in range(CAPACITY - 1):
                other = await book(http, slot, new_id())
                assert other.status_code == 201, other.text

    await _flush_and_restart(private_redis, split)

    async with httpx.AsyncClient(base_url=split.url, timeout=30) as http:
        if slot_filled:
            late = await book(http, slot, new_id())
            assert late.status_code == 409 and late.json()["code"] == "slot_full", late.text
        again = await book(http, slot, patient, key)
    assert again.status_code == 200, again.text
    assert again.json() == first.json()
