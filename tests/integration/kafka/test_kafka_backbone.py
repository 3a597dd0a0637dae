"""The Kafka backbone against a real Kafka-protocol broker (Tansu) and real PostgreSQL."""

from __future__ import annotations

import asyncio
import contextlib
import signal
import sys
import uuid
from collections import Counter, defaultdict
from pathlib import Path
from typing import Any

import orjson
import pytest
from aiokafka import AIOKafkaProducer

from reservo.core.db.database import Database
from reservo.core.embedded import EmbeddedKafka
from reservo.core.kernel.clock import OffsetClock
from reservo.core.kernel.contract import TYPE_PREFIX
from reservo.core.messaging.inbox import once_many
from reservo.core.messaging.outbox import OutboxRelay
from reservo.core.messaging.transport.envelope import from_record
from reservo.core.messaging.transport.kafka import KafkaConsumerRunner
from tests.helpers.kafka import (
    Background,
    count_status,
    effect_handler,
    effects,
    emit_events,
    read_topic,
    relay,
    runner,
    transport,
    unique_topic,
)
from tests.helpers.waiting import wait_until

pytestmark = pytest.mark.timeout(120)
REPO_ROOT = str(Path(__file__).resolve().parents[3])


async def test_events_published_once_and_consumed_once_in_order_per_key(
    kafka_bootstrap: str, kdb: Database, kclock: OffsetClock, background: Background
) -> None:
    topic = unique_topic("order")
    written = await emit_events(kdb, kclock, topic, 600, keys=12)
    t = transport(kafka_bootstrap)
    r = relay(kdb, kclock, t, batch_size=250)
    background.start(r.run(background.stop))
    await wait_until(lambda: _all_done(kdb, topic, 600), 30, "relay to publish everything")

    records = await read_topic(kafka_bootstrap, topic)
    # CloudEvents binary mode: the attributes in headers, the payload as value.
    envelopes = [from_record(rec.headers, rec.value) for rec in records]
    ids = Counter(e.id for e in envelopes)
    assert set(ids) == {eid for eid, _, _ in written}
    assert max(ids.values()) == 1  # published once each
    headers = dict(records[0].headers)
    assert (
        headers["ce_specversion"] == b"1.0"
        and headers["ce_type"] == TYPE_PREFIX.encode() + topic.encode()
    )
    assert headers["ce_source"] == b"/reservo" and headers["content-type"] == b"application/json"
    assert orjson.loads(records[0].value) == envelopes[0].payload
    # One key lives in one partition, in the order it was written.
    by_key: dict[str, list[tuple[int, int, int]]] = defaultdict(list)
    for rec, e in zip(records, envelopes, strict=True):
        assert (
            e.key is not None and rec.key == e.key.encode() == dict(rec.headers)["ce_partitionkey"]
        )
        by_key[e.key].append((rec.partition, rec.offset, e.payload["seq"]))
    for key, items in by_key.items():
        assert len({p for p, _, _ in items}) == 1, key
        assert [s for _, _, s in sorted(items)] == list(range(len(items))), key

    consumer = f"c-{uuid.uuid4().hex[:6]}"
    calls: Counter[uuid.UUID] = Counter()
    run = runner(
        kafka_bootstrap, consumer, {topic: effect_handler(kdb, consumer, calls)}, kdb, kclock
    )
    background.start(run.run(background.stop))
    await wait_until(lambda: _effects_count(kdb, consumer, 600), 30, "consumer to apply all")

    applied = await effects(kdb, consumer)
    assert len(applied) == 600 and len({eid for eid, _, _ in applied}) == 600  # once each
    assert max(calls.values()) == 1  # and not even redelivered in normal operation
    seqs: dict[str, list[int]] = defaultdict(list)
    for _, key, seq in applied:
        seqs[key].append(seq)
    for key, got in seqs.items():
        assert got == sorted(got), f"key {key} applied out of order"


async def _all_done(db: Database, topic: str, n: int) -> bool:
    return await count_status(db, topic, "DONE") == n


async def _effects_count(db: Database, consumer: str, n: int) -> bool:
    return len(await effects(db, consumer)) >= n


async def test_broker_down_mid_run_relay_retries_nothing_lost_and_resumes(
    tmp_path: Path, kdb: Database, kclock: OffsetClock, background: Background
) -> None:
    broker = EmbeddedKafka(tmp_path)  # our own broker: this test stops it
    bootstrap = broker.start()
    try:
        topic = unique_topic("outage")
        consumer = f"c-{uuid.uuid4().hex[:6]}"
        t = transport(bootstrap, request_timeout_ms=1500)
        background.start(relay(kdb, kclock, t, batch_size=100).run(background.stop))
        first = await emit_events(kdb, kclock, topic, 100, keys=5)
        handler = effect_handler(kdb, consumer)
        background.start(
            runner(bootstrap, consumer, {topic: handler}, kdb, kclock).run(background.stop)
        )
        await wait_until(lambda: _effects_count(kdb, consumer, 100), 30, "first 100 consumed")

        broker.stop()
        second = await emit_events(kdb, kclock, topic, 100, keys=5)
        await asyncio.sleep(4)  # several relay attempts against a dead broker
        assert await count_status(kdb, topic, "DONE") == 100  # nothing marked without an ack
        assert await count_status(kdb, topic, "DEAD") == 0  # an outage kills no event
        async with kdb.connection() as conn:
            attempts = await conn.fetchval(
                "SELECT max(attempts) FROM outbox WHERE topic = $1 AND status = 'PENDING'", topic
            )
        assert attempts <= 1  # outage attempts are handed back, not spent

        broker.start()  # same port; Tansu's memory store starts empty
        await wait_until(lambda: _all_done(kdb, topic, 200), 60, "relay to resume")
        await wait_until(lambda: _effects_count(kdb, consumer, 200), 60, "consumer to resume")
        applied = await effects(kdb, consumer)
        assert sorted(e for e, _, _ in applied) == sorted(e for e, _, _ in first + second)
        on_new_broker = Counter(
            from_record(r.headers, r.value).id for r in await read_topic(bootstrap, topic)
        )
        assert set(on_new_broker) == {e for e, _, _ in second}
        assert max(on_new_broker.values()) == 1
    finally:
        background.stop.set()
        await asyncio.wait(background.tasks, timeout=30)
        broker.stop()


async def test_consumer_killed_before_commit_is_redelivered_and_applied_once(
    kafka_bootstrap: str,
    kafka_database_url: str,
    kdb: Database,
    kclock: OffsetClock,
    background: Background,
) -> None:
    topic = unique_topic("kill")
    consumer = f"c-{uuid.uuid4().hex[:6]}"
    written = await emit_events(kdb, kclock, topic, 60, keys=6)
    background.start(relay(kdb, kclock, transport(kafka_bootstrap)).run(background.stop))
    await wait_until(lambda: _all_done(kdb, topic, 60), 30, "publish")
    victim = written[30][0]
    proc = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "tests.integration.kafka.crash_consumer",
        kafka_bootstrap,
        kafka_database_url,
        topic,
        consumer,
        str(victim),
        cwd=REPO_ROOT,
        stdout=asyncio.subprocess.DEVNULL,
        stderr=asyncio.subprocess.DEVNULL,
    )
    code = await asyncio.wait_for(proc.wait(), 60)
    assert code == -signal.SIGKILL  # it died inside the handler, after the effect committed
    applied_before = {e for e, _, _ in await effects(kdb, consumer)}
    assert victim in applied_before

    calls: Counter[uuid.UUID] = Counter()
    handler = effect_handler(kdb, consumer, calls)
    background.start(
        runner(kafka_bootstrap, consumer, {topic: handler}, kdb, kclock).run(background.stop)
    )
    await wait_until(lambda: _effects_count(kdb, consumer, 60), 60, "the survivor to finish")
    await asyncio.sleep(0.5)
    assert calls[victim] >= 1  # redelivered: its offset was never committed
    applied = await effects(kdb, consumer)
    assert Counter(e for e, _, _ in applied) == Counter(e for e, _, _ in written)  # once each


async def test_two_relays_in_parallel_publish_no_duplicates(
    kafka_bootstrap: str, kdb: Database, kclock: OffsetClock, background: Background
) -> None:
    topic = unique_topic("pair")
    written = await emit_events(kdb, kclock, topic, 3000, keys=50)
    transports = [transport(kafka_bootstrap), transport(kafka_bootstrap)]
    relays = [relay(kdb, kclock, t, batch_size=200) for t in transports]
    go = asyncio.Event()

    async def run(r: OutboxRelay) -> None:
        await go.wait()  # released together
        await r.run(background.stop)

    for r in relays:
        background.start(run(r))
    go.set()
    await wait_until(lambda: _all_done(kdb, topic, 3000), 60, "both relays to drain")
    published = [t for t in transports if t._producer is not None]
    assert len(published) == 2  # both relays really took part
    ids = Counter(
        from_record(r.headers, r.value).id for r in await read_topic(kafka_bootstrap, topic)
    )
    assert set(ids) == {e for e, _, _ in written}
    assert max(ids.values()) == 1


async def test_poison_event_is_parked_and_the_partition_moves_on(
    kafka_bootstrap: str, kdb: Database, kclock: OffsetClock, background: Background
) -> None:
    topic = unique_topic("poison")
    consumer = f"c-{uuid.uuid4().hex[:6]}"
    t = transport(kafka_bootstrap, topic_partitions={topic: 1})  # one partition: strict line
    written = await emit_events(kdb, kclock, topic, 3, keys=1)
    background.start(relay(kdb, kclock, t).run(background.stop))
    await wait_until(lambda: _all_done(kdb, topic, 3), 30, "publish")
    # A record that is not even an envelope, then a good one behind it.
    producer = AIOKafkaProducer(bootstrap_servers=kafka_bootstrap, acks="all")
    await producer.start()
    try:
        await producer.send_and_wait(topic, b"{not json", key=b"agg-0")
    finally:
        await producer.stop()
    tail = await emit_events(kdb, kclock, topic, 1, keys=1)
    await wait_until(lambda: _all_done(kdb, topic, 4), 30, "publish tail")

    poison = written[1][0]
    calls: Counter[uuid.UUID] = Counter()
    handler = effect_handler(kdb, consumer, calls, poison={poison})
    run = runner(kafka_bootstrap, consumer, {topic: handler}, kdb, kclock)
    background.start(run.run(background.stop))
    await wait_until(lambda: _effects_count(kdb, consumer, 3), 30, "the partition to move on")
    applied = [e for e, _, _ in await effects(kdb, consumer)]
    assert applied == [written[0][0], written[2][0], tail[0][0]]  # in order, poison skipped
    assert calls[poison] == 1  # rejected: parked at once, never retried
    async with kdb.connection() as conn:
        parked = await conn.fetch(
            "SELECT event_id, attempts, error, record_offset FROM dead_letter "
            "WHERE consumer = $1 ORDER BY record_offset",
            consumer,
        )
    assert [(p["event_id"], p["attempts"]) for p in parked] == [(poison, 1), (None, 1)]
    assert "poison event" in parked[0]["error"]
    dlt = await read_topic(kafka_bootstrap, topic + ".dlt")
    assert sorted(r.value for r in dlt) == sorted(
        [b"{not json", _value_of(await read_topic(kafka_bootstrap, topic), poison)]
    )
    # The poison record's dead-letter copy keeps its CloudEvents headers.
    assert {from_record(r.headers, r.value).id for r in dlt if r.value != b"{not json"} == {poison}


async def test_a_transient_failure_is_retried_past_any_budget_and_never_parked(
    kafka_bootstrap: str, kdb: Database, kclock: OffsetClock, background: Background
) -> None:
    """A dependency away for far longer than the quick retries: the record waits,
    is read again and again, and applies once when the dependency is back."""
    topic = unique_topic("transient")
    consumer = f"c-{uuid.uuid4().hex[:6]}"
    t = transport(kafka_bootstrap, topic_partitions={topic: 1})
    written = await emit_events(kdb, kclock, topic, 3, keys=1)
    background.start(relay(kdb, kclock, t).run(background.stop))
    await wait_until(lambda: _all_done(kdb, topic, 3), 30, "publish")

    calls: Counter[uuid.UUID] = Counter()
    inner = effect_handler(kdb, consumer, calls)
    outage = asyncio.Event()

    async def flaky(event: Any) -> None:
        if not outage.is_set():
            calls[event.id] += 1
            raise ConnectionRefusedError("the dependency is away")
        await inner(event)

    run = runner(kafka_bootstrap, consumer, {topic: flaky}, kdb, kclock, quick_retries=2)
    background.start(run.run(background.stop))
    first = written[0][0]
    await wait_until(lambda: _calls_over(calls, first, 12), 30, "many retries")
    assert await effects(kdb, consumer) == []  # nothing applied, nothing skipped
    outage.set()
    await wait_until(lambda: _effects_count(kdb, consumer, 3), 30, "the backlog after the outage")
    assert [e for e, _, _ in await effects(kdb, consumer)] == [e for e, _, _ in written]
    async with kdb.connection() as conn:
        parked = await conn.fetchval(
            "SELECT count(*) FROM dead_letter WHERE consumer = $1", consumer
        )
    assert parked == 0


async def _calls_over(calls: Counter[uuid.UUID], event_id: uuid.UUID, n: int) -> bool:
    return calls[event_id] > n


def _value_of(records: list[Any], event_id: uuid.UUID) -> bytes:
    for r in records:
        with contextlib.suppress(ValueError):
            if from_record(r.headers, r.value).id == event_id:
                return bytes(r.value)
    raise AssertionError("not found")


def effect_batch_handler(
    db: Database, consumer: str, sizes: list[int], poison: set[uuid.UUID] | None = None
) -> Any:
    """The batch form of ``effect_handler``: one transaction per call (inbox.once_many)."""

    async def handle(events: Any) -> None:
        sizes.append(len(events))
        if poison and any(e.id in poison for e in events):
            raise RuntimeError("poison in the batch")

        async def apply(conn: Any, fresh: list[Any]) -> None:
            await conn.executemany(
                "INSERT INTO kafka_test_effect (consumer, event_id, key, seq) "
                "VALUES ($1, $2, $3, $4)",
                [(consumer, e.id, e.key, e.payload["seq"]) for e in fresh],
            )

        await once_many(db, consumer, events, apply)

    return handle


def batch_runner(
    bootstrap: str,
    db: Database,
    clock: OffsetClock,
    topic: str,
    calls: Counter[uuid.UUID],
    sizes: list[int],
    poison: set[uuid.UUID] | None = None,
    **kw: Any,
) -> tuple[str, KafkaConsumerRunner]:
    """A fresh consumer group with both forms of the effect handler."""
    consumer = f"c-{uuid.uuid4().hex[:6]}"
    return consumer, runner(
        bootstrap,
        consumer,
        {topic: effect_handler(db, consumer, calls, poison=poison)},
        db,
        clock,
        batch_handlers={topic: effect_batch_handler(db, consumer, sizes, poison=poison)},
        **kw,
    )


async def test_batch_handler_consumes_each_event_once_in_order_per_key(
    kafka_bootstrap: str, kdb: Database, kclock: OffsetClock, background: Background
) -> None:
    topic = unique_topic("batch")
    written = await emit_events(kdb, kclock, topic, 3000, keys=40)
    background.start(relay(kdb, kclock, transport(kafka_bootstrap)).run(background.stop))
    await wait_until(lambda: _all_done(kdb, topic, 3000), 30, "publish")

    calls: Counter[uuid.UUID] = Counter()
    sizes: list[int] = []
    consumer, run = batch_runner(kafka_bootstrap, kdb, kclock, topic, calls, sizes)
    background.start(run.run(background.stop))
    await wait_until(lambda: _effects_count(kdb, consumer, 3000), 30, "consumer to apply all")

    applied = await effects(kdb, consumer)
    assert sorted(e for e, _, _ in applied) == sorted(e for e, _, _ in written)  # once each
    assert not calls  # the one-by-one handler was never needed
    assert sum(sizes) == 3000 and len(sizes) < 3000 / 10, sizes  # really batched
    seqs: dict[str, list[int]] = defaultdict(list)
    for _, key, seq in applied:
        seqs[key].append(seq)
    assert all(got == sorted(got) for got in seqs.values())


async def test_poison_in_a_batch_is_parked_and_the_rest_applied_in_order(
    kafka_bootstrap: str, kdb: Database, kclock: OffsetClock, background: Background
) -> None:
    topic = unique_topic("batchpoison")
    t = transport(kafka_bootstrap, topic_partitions={topic: 1})  # one partition: one batch
    written = await emit_events(kdb, kclock, topic, 50, keys=1)
    background.start(relay(kdb, kclock, t).run(background.stop))
    await wait_until(lambda: _all_done(kdb, topic, 50), 30, "publish")

    poison = written[20][0]
    calls: Counter[uuid.UUID] = Counter()
    sizes: list[int] = []
    consumer, run = batch_runner(kafka_bootstrap, kdb, kclock, topic, calls, sizes, poison={poison})
    background.start(run.run(background.stop))
    await wait_until(lambda: _effects_count(kdb, consumer, 49), 30, "the rest to be applied")
    applied = [e for e, _, _ in await effects(kdb, consumer)]
    assert applied == [e for e, _, _ in written if e != poison]  # in order, poison skipped
    assert calls[poison] == 1  # the batch failed, one by one isolated it and parked it
    assert sizes and sizes[0] > 1
    async with kdb.connection() as conn:
        parked = await conn.fetch(
            "SELECT event_id, attempts FROM dead_letter WHERE consumer = $1", consumer
        )
    assert [(p["event_id"], p["attempts"]) for p in parked] == [(poison, 1)]
