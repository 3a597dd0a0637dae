"""The Kafka transport connects its producer lazily, at the first delivery. The
results webhook's publisher delivers one event per request, so the first
requests after a start arrive together: they must share one producer. Each
concurrent first delivery used to start a producer of its own and keep the
last, leaking the others with their background sender tasks ("Unclosed
AIOKafkaProducer" in the API's log, one per request of the first burst)."""

from __future__ import annotations

import asyncio
import uuid
from datetime import UTC, datetime

from reservo.core.messaging.transport.base import Event
from tests.helpers.kafka import transport, unique_topic

FIRST_BURST = 16


def _senders() -> set[asyncio.Task[object]]:
    """Producers running in this loop: each has one sender task. Compared as sets,
    so that an earlier test's producer stopping meanwhile does not count."""
    return {t for t in asyncio.all_tasks() if "_sender_routine" in repr(t.get_coro())}


async def test_concurrent_first_deliveries_share_one_producer(kafka_bootstrap: str) -> None:
    before = _senders()
    t = transport(kafka_bootstrap)
    topic = unique_topic("first")
    events = [
        Event(uuid.uuid4(), topic, f"k{i}", {"i": i}, datetime.now(UTC)) for i in range(FIRST_BURST)
    ]
    barrier = asyncio.Barrier(FIRST_BURST)

    async def deliver(event: Event) -> list[BaseException | None]:
        await barrier.wait()
        return await t.deliver([event])

    try:
        results = await asyncio.gather(*(deliver(e) for e in events))
        running = len(_senders() - before)
    finally:
        await t.stop()
    assert results == [[None]] * FIRST_BURST
    assert running == 1
    assert not _senders() - before
