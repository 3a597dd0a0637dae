"""Shared helpers of the Kafka tests (a real broker, a real database)."""

from __future__ import annotations

import asyncio
import time
import uuid
from collections import Counter
from collections.abc import Coroutine
from typing import Any

from aiokafka import AIOKafkaConsumer, ConsumerRecord, TopicPartition

from reservo.core.db.database import Database
from reservo.core.kernel.clock import Clock
from reservo.core.messaging.failures import Rejected
from reservo.core.messaging.inbox import once
from reservo.core.messaging.outbox import OutboxRelay, emit
from reservo.core.messaging.transport.base import Event, Handler
from reservo.core.messaging.transport.kafka import KafkaConsumerRunner, KafkaTransport


async def emit_events(
    db: Database, clock: Clock, topic: str, n: int, keys: int
) -> list[tuple[uuid.UUID, str, int]]:
    """n events over ``keys`` aggregates; seq is the per-key order they were written in."""
    out: list[tuple[uuid.UUID, str, int]] = []
    per_key: Counter[str] = Counter()
    async with db.transaction() as conn:
        for i in range(n):
            key = f"agg-{i % keys}"
            seq = per_key[key]
            per_key[key] += 1
            event_id = await emit(conn, topic, key, {"seq": seq, "key": key}, clock.now())
            out.append((event_id, key, seq))
    return out


async def count_status(db: Database, topic: str, status: str) -> int:
    async with db.connection() as conn:
        n: int = await conn.fetchval(
            "SELECT count(*) FROM outbox WHERE topic = $1 AND status = $2", topic, status
        )
    return n


async def read_topic(bootstrap: str, topic: str) -> list[ConsumerRecord[bytes, bytes]]:
    """Every record of the topic, read without a group (nothing committed)."""
    consumer = AIOKafkaConsumer(bootstrap_servers=bootstrap, enable_auto_commit=False)
    await consumer.start()
    try:
        parts = consumer.partitions_for_topic(topic)
        for _ in range(50):
            if parts:
                break
            await consumer._client.force_metadata_update()
            await asyncio.sleep(0.1)
            parts = consumer.partitions_for_topic(topic)
        assert parts, f"topic {topic} not found"
        tps = [TopicPartition(topic, p) for p in sorted(parts)]
        consumer.assign(tps)
        await consumer.seek_to_beginning(*tps)
        end = await consumer.end_offsets(tps)
        records: list[ConsumerRecord[bytes, bytes]] = []
        deadline = time.monotonic() + 30
        while [tp for tp in tps if await consumer.position(tp) < end[tp]]:
            assert time.monotonic() < deadline, "reading the topic took too long"
            batch = await consumer.getmany(timeout_ms=200, max_records=5000)
            for recs in batch.values():
                records.extend(recs)
        return records
    finally:
        await consumer.stop()


def effect_handler(
    db: Database,
    consumer: str,
    calls: Counter[uuid.UUID] | None = None,
    poison: set[uuid.UUID] | None = None,
) -> Handler:
    """An idempotent handler: records its effect through the inbox, once per event."""

    async def handle(event: Event) -> None:
        if calls is not None:
            calls[event.id] += 1
        if poison and event.id in poison:
            raise Rejected(f"poison event {event.id}")

        async def apply(conn: Any) -> None:
            await conn.execute(
                "INSERT INTO kafka_test_effect (consumer, event_id, key, seq) "
                "VALUES ($1, $2, $3, $4)",
                consumer,
                event.id,
                event.key,
                event.payload["seq"],
            )

        await once(db, consumer, event, apply)

    return handle


def transport(bootstrap: str, **kw: Any) -> KafkaTransport:
    kw.setdefault("idempotence", False)  # Tansu's memory store has no InitProducerId
    kw.setdefault("partitions", 3)
    kw.setdefault("request_timeout_ms", 5000)
    return KafkaTransport(bootstrap, **kw)


def relay(db: Database, clock: Clock, t: KafkaTransport, batch_size: int = 500) -> OutboxRelay:
    return OutboxRelay(
        db,
        t,
        clock,
        batch_size=batch_size,
        lease_s=30,
        backoff_base_s=0.05,
        backoff_max_s=0.5,
        poll_interval_s=0.05,
        pipelined=True,
    )


def runner(
    bootstrap: str,
    consumer: str,
    handlers: dict[str, Handler],
    db: Database,
    clock: Clock,
    **kw: Any,
) -> KafkaConsumerRunner:
    kw.setdefault("idempotence", False)
    kw.setdefault("partitions", 3)
    kw.setdefault("backoff_base_s", 0.01)
    kw.setdefault("backoff_max_s", 0.05)
    kw.setdefault("session_timeout_ms", 6000)
    kw.setdefault("request_timeout_ms", 5000)
    return KafkaConsumerRunner(bootstrap, consumer, handlers, db, clock, **kw)


async def effects(db: Database, consumer: str) -> list[tuple[uuid.UUID, str, int]]:
    async with db.connection() as conn:
        rows = await conn.fetch(
            "SELECT event_id, key, seq FROM kafka_test_effect WHERE consumer = $1 ORDER BY id",
            consumer,
        )
    return [(r["event_id"], r["key"], r["seq"]) for r in rows]


class Background:
    """Background workers of one test, stopped (and awaited) even when the test fails."""

    def __init__(self) -> None:
        self.stop = asyncio.Event()
        self.tasks: list[asyncio.Task[None]] = []

    def start(self, work: Coroutine[Any, Any, None]) -> asyncio.Task[None]:
        task = asyncio.create_task(work)
        self.tasks.append(task)
        return task


def unique_topic(name: str) -> str:
    return f"test.{name}{uuid.uuid4().hex[:8]}.v1"
