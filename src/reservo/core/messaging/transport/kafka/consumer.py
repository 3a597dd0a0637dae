"""Consuming from Kafka: one consumer group per consumer (see the package's docstring)."""

from __future__ import annotations

import asyncio
from dataclasses import replace
from typing import Any

import structlog
from aiokafka import AIOKafkaConsumer, AIOKafkaProducer, ConsumerRecord, TopicPartition
from aiokafka.errors import KafkaError
from prometheus_client import Counter

from reservo.core.aio.backoff import backoff_delay
from reservo.core.aio.loops import pause
from reservo.core.aio.retry import retry_async
from reservo.core.db.database import Database, Queries
from reservo.core.kernel import tracing
from reservo.core.kernel.clock import Clock
from reservo.core.kernel.contract import EventRegistry
from reservo.core.kernel.metrics import PARKED, TRANSIENT_FAILURES
from reservo.core.messaging.failures import is_transient
from reservo.core.messaging.ordering import by_key_in_order
from reservo.core.messaging.transport.base import BatchHandler, Event, Handler
from reservo.core.messaging.transport.envelope import from_record, to_cloudevent
from reservo.core.messaging.transport.kafka.admin import ensure_topics

log = structlog.get_logger(__name__)
Q = Queries.load("reservo.core.messaging")

DLT_SUFFIX = ".dlt"
# A consumer session that failed is started again after a capped backoff.
RESTART_BACKOFF_S, RESTART_BACKOFF_MAX_S = 0.2, 5.0

KAFKA_CONSUMED = Counter(
    "reservo_kafka_consumed_total", "Records handled by a consumer group", ["consumer", "topic"]
)


class KafkaConsumerRunner:
    """Runs one consumer group until ``stop`` is set; survives broker restarts."""

    def __init__(
        self,
        bootstrap: str,
        consumer: str,
        handlers: dict[str, Handler],
        db: Database,
        clock: Clock,
        *,
        group_prefix: str = "reservo",
        partitions: int = 6,
        replication_factor: int = 1,
        topic_partitions: dict[str, int] | None = None,
        quick_retries: int = 3,
        backoff_base_s: float = 0.2,
        backoff_max_s: float = 5.0,
        dead_letter_topic: bool = True,
        idempotence: bool = True,
        max_records: int = 1000,
        session_timeout_ms: int = 10_000,
        request_timeout_ms: int = 30_000,
        concurrency: int = 16,
        batch_handlers: dict[str, BatchHandler] | None = None,
        events: EventRegistry | None = None,
        source: str = "/reservo",
        legacy_topics: bool = True,
    ) -> None:
        if not handlers:
            raise ValueError(f"consumer {consumer!r} has no topics")
        self.bootstrap, self.consumer, self.handlers = bootstrap, consumer, handlers
        self.events, self.source = events or EventRegistry(), source
        self.legacy_topics = legacy_topics
        self.batch_handlers = batch_handlers or {}
        self.db, self.clock = db, clock
        self.group_id = f"{group_prefix}.{consumer}"
        self.partitions, self.replication_factor = partitions, replication_factor
        self.topic_partitions = topic_partitions or {}
        self.quick_retries = quick_retries
        # Consecutive deferrals per partition: the backoff grows while an outage lasts.
        self._deferrals: dict[TopicPartition, int] = {}
        self.backoff_base_s, self.backoff_max_s = backoff_base_s, backoff_max_s
        self.dead_letter_topic, self.idempotence = dead_letter_topic, idempotence
        self.max_records, self.session_timeout_ms = max_records, session_timeout_ms
        self.request_timeout_ms = request_timeout_ms
        # Handlers running at once (keep below the database pool size).
        self._slots = asyncio.Semaphore(concurrency)
        self._consumer: AIOKafkaConsumer | None = None
        self._dlt: AIOKafkaProducer | None = None
        # Set once the group gave this member its partitions (tests wait on it).
        self.assigned = asyncio.Event()

    async def run(self, stop: asyncio.Event) -> None:
        failures = 0
        while not stop.is_set():
            try:
                await self._session(stop)
                failures = 0
            except asyncio.CancelledError:
                raise
            except Exception as exc:
                failures += 1
                log.warning("kafka_consumer_restart", consumer=self.consumer, error=repr(exc))
                await pause(stop, backoff_delay(failures, RESTART_BACKOFF_S, RESTART_BACKOFF_MAX_S))

    def topics(self) -> list[str]:
        """What the group reads: the streams of the events it handles and, unless
        ``legacy_topics`` is off, the topics their 0.2.0 names had (records
        published before the upgrade)."""
        streams = self.events.streams(self.handlers)
        if not self.legacy_topics:
            return streams
        return streams + self.events.former_topics(self.handlers)

    async def _session(self, stop: asyncio.Event) -> None:
        streams = self.events.streams(self.handlers)
        topics = self.topics()
        all_topics = streams + ([t + DLT_SUFFIX for t in streams] if self.dead_letter_topic else [])
        await ensure_topics(
            self.bootstrap,
            all_topics,
            self.partitions,
            self.replication_factor,
            self.topic_partitions,
            timeout_ms=self.request_timeout_ms,
        )
        consumer = AIOKafkaConsumer(
            *topics,
            bootstrap_servers=self.bootstrap,
            group_id=self.group_id,
            client_id=f"reservo-{self.consumer}",
            enable_auto_commit=False,  # we commit after the handler, never before
            auto_offset_reset="earliest",
            max_poll_records=self.max_records,
            session_timeout_ms=self.session_timeout_ms,
            heartbeat_interval_ms=max(100, self.session_timeout_ms // 4),
            request_timeout_ms=self.request_timeout_ms,
        )
        self._consumer = consumer
        try:
            await consumer.start()
            if self.dead_letter_topic:
                self._dlt = AIOKafkaProducer(
                    bootstrap_servers=self.bootstrap,
                    acks="all",
                    enable_idempotence=self.idempotence,
                    request_timeout_ms=self.request_timeout_ms,
                )
                await self._dlt.start()
            log.info("kafka_consumer_started", consumer=self.consumer, group=self.group_id)
            while not stop.is_set():
                batch = await consumer.getmany(timeout_ms=200, max_records=self.max_records)
                if consumer.assignment():
                    self.assigned.set()
                if batch:
                    await asyncio.gather(
                        *(self._partition(consumer, tp, records) for tp, records in batch.items())
                    )
        finally:
            self._consumer = None
            # stop() without a commit: whatever was not committed is redelivered.
            await consumer.stop()
            if self._dlt is not None:
                dlt, self._dlt = self._dlt, None
                await dlt.stop()

    async def _partition(
        self,
        consumer: AIOKafkaConsumer,
        tp: TopicPartition,
        records: list[ConsumerRecord[Any, Any]],
    ) -> None:
        """Handle one partition's records: in order per key, different keys concurrently
        (the events promise order per aggregate, their key, not per partition; and
        one handler transaction per event is commit-latency bound). A record without
        a key is its own group. Commit up to the first record not finished."""
        if self.batch_handlers and await self._try_batch(tp, records):
            await self._commit(consumer, tp, records[-1].offset + 1)
            return
        failed: list[tuple[int, BaseException]] = []

        async def handle(record: ConsumerRecord[Any, Any]) -> None:
            try:
                async with self._slots:
                    await self._handle(record)
            except Exception as exc:  # neither handled nor parked (e.g. database down)
                failed.append((record.offset, exc))
                raise  # later records of this key must wait for this one

        await by_key_in_order(records, lambda r: r.key if r.key is not None else r.offset, handle)
        # Every record before the first failure is finished; redelivered ones dedupe.
        next_offset = min(o for o, _ in failed) if failed else records[-1].offset + 1
        if failed:
            log.warning(
                "kafka_record_deferred",
                consumer=self.consumer,
                topic=tp.topic,
                partition=tp.partition,
                offset=next_offset,
                error=repr(min(failed, key=lambda f: f[0])[1]),
            )
            consumer.seek(tp, next_offset)  # re-read from there later
            deferrals = self._deferrals[tp] = self._deferrals.get(tp, 0) + 1
            TRANSIENT_FAILURES.labels(consumer=self.consumer).inc()
            await asyncio.sleep(backoff_delay(deferrals, self.backoff_base_s, self.backoff_max_s))
        else:
            self._deferrals.pop(tp, None)
        if next_offset > records[0].offset:
            await self._commit(consumer, tp, next_offset)

    async def _commit(self, consumer: AIOKafkaConsumer, tp: TopicPartition, offset: int) -> None:
        try:
            await consumer.commit({tp: offset})
        except KafkaError as exc:
            # Partition moved to another member meanwhile: it will redeliver, handlers dedupe.
            log.warning("kafka_commit_failed", consumer=self.consumer, error=repr(exc))

    def _event(self, record: ConsumerRecord[Any, Any]) -> Event:
        """The record's event under its current name (ValueError: malformed)."""
        event = from_record(record.headers, record.value)
        name = self.events.current(event.topic)
        return event if name == event.topic else replace(event, topic=name)

    async def _try_batch(self, tp: TopicPartition, records: list[ConsumerRecord[Any, Any]]) -> bool:
        """A partition's records through the batch handler, when one batch handler
        takes every event of them this consumer handles (the others are not its
        business); False (nothing applied) sends them down the one-by-one path,
        which retries and parks."""
        try:
            events = [traced(e, r) for r in records if (e := self._event(r)).topic in self.handlers]
        except ValueError:
            return False  # the one-by-one path parks the malformed record
        batches = {
            id(self.batch_handlers.get(e.topic)): self.batch_handlers.get(e.topic) for e in events
        }
        batch = next(iter(batches.values()), None)
        if len(batches) != 1 or batch is None:
            return False
        try:
            async with self._slots:
                await batch(events)
        except Exception as exc:
            log.warning(
                "kafka_batch_failed",
                consumer=self.consumer,
                topic=tp.topic,
                partition=tp.partition,
                records=len(records),
                error=repr(exc),
            )
            return False
        KAFKA_CONSUMED.labels(consumer=self.consumer, topic=tp.topic).inc(len(records))
        return True

    async def _handle(self, record: ConsumerRecord[Any, Any]) -> None:
        try:
            event = traced(self._event(record), record)
        except ValueError as exc:  # retrying cannot fix a malformed record
            await self._park(record, None, exc, attempts=1)
            return
        handler = self.handlers.get(event.topic)
        if handler is None:  # another event of the stream: not this consumer's
            return
        # The handler's work, its log lines and its outbound calls in the event's trace.
        with tracing.handling(
            event.traceparent,
            event.request_id,
            f"{event.topic} process",
            {
                "messaging.system": "kafka",
                "messaging.destination.name": record.topic,
                "messaging.consumer.group.name": self.group_id,
                "messaging.message.id": str(event.id),
            },
        ):
            try:
                await retry_async(
                    lambda: handler(event),
                    name=f"kafka_consumer.{self.consumer}",
                    attempts=self.quick_retries,
                    base_s=self.backoff_base_s,
                    max_s=self.backoff_max_s,
                    retry_if=is_transient,
                )
            except Exception as exc:
                if is_transient(exc):
                    raise  # not the event's fault: the partition waits and reads it again
                await self._park(record, event, exc, attempts=1)
                return
        KAFKA_CONSUMED.labels(consumer=self.consumer, topic=record.topic).inc()

    async def _park(
        self,
        record: ConsumerRecord[Any, Any],
        event: Event | None,
        exc: BaseException,
        attempts: int,
    ) -> None:
        log.error(
            "kafka_record_parked",
            consumer=self.consumer,
            topic=record.topic,
            partition=record.partition,
            offset=record.offset,
            event_id=None if event is None else str(event.id),
            error=repr(exc),
        )
        async with self.db.connection() as conn:
            await conn.execute(
                Q.dead_letter_insert,
                self.consumer,
                record.topic if event is None else event.topic,
                record.partition,
                record.offset,
                None if event is None else event.id,
                None if record.key is None else record.key.decode(errors="replace"),
                # At rest, the structured envelope (the record's headers are not
                # kept): what the replay reads, whichever transport parked it.
                (record.value or b"") if event is None else to_cloudevent(event, self.source),
                repr(exc)[:2000],
                attempts,
                self.clock.now(),
            )
        if self._dlt is not None:
            headers = [
                *(record.headers or ()),
                ("reservo-consumer", self.consumer.encode()),
                ("reservo-error", repr(exc)[:500].encode()),
                ("reservo-offset", str(record.offset).encode()),
            ]
            topic = record.topic if event is None else self.events.stream(event.topic)
            await self._dlt.send_and_wait(
                topic + DLT_SUFFIX, record.value, key=record.key, headers=headers
            )
        PARKED.labels(consumer=self.consumer, topic=record.topic).inc()


# -- trace context --------------------------------------------------------------------
# Read back from the record's headers (producer.trace_headers): ``traceparent`` (W3C Trace
# Context, as the Kafka instrumentations of OpenTelemetry read it) and
# ``x-request-id``, so a consumer that is not reservo's can follow them too.


def traced(event: Event, record: ConsumerRecord[Any, Any]) -> Event:
    """The event with the trace context and request id its record's headers carry
    (a header that is not valid is ignored, as a traceparent must be)."""
    traceparent = request_id = None
    for name, value in record.headers or ():
        if name == "traceparent" and tracing.parse_traceparent(value) is not None:
            traceparent = value.decode("ascii")
        elif name == "x-request-id" and tracing.valid_request_id(value):
            request_id = value.decode("ascii")
    if traceparent is None and request_id is None:
        return event
    return replace(event, traceparent=traceparent, request_id=request_id)
