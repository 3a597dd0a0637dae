"""Publishing to Kafka: the outbox relay's transport (see the package's docstring)."""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Iterable, Sequence
from typing import Any

import structlog
from aiokafka import AIOKafkaProducer
from aiokafka.errors import KafkaConnectionError, KafkaError, KafkaTimeoutError
from prometheus_client import Counter

from reservo.core.aio.breaker import BreakerOpen, CircuitBreaker
from reservo.core.kernel import tracing
from reservo.core.kernel.contract import EventRegistry
from reservo.core.messaging.transport.base import Event, TransportUnavailable
from reservo.core.messaging.transport.envelope import to_record
from reservo.core.messaging.transport.kafka.admin import ensure_topics

log = structlog.get_logger(__name__)

KAFKA_PUBLISHED = Counter("reservo_kafka_published_total", "Records acked by Kafka", ["topic"])


def _unavailable(exc: BaseException) -> bool:
    """Errors that say "the broker is not there", as opposed to "this record is bad"."""
    if isinstance(exc, (KafkaConnectionError, KafkaTimeoutError, TransportUnavailable)):
        return True
    return isinstance(exc, KafkaError) and bool(getattr(exc, "retriable", False))


class KafkaTransport:
    def __init__(
        self,
        bootstrap: str,
        *,
        source: str = "/reservo",
        topics: Callable[[], Iterable[str]] = tuple,
        partitions: int = 6,
        replication_factor: int = 1,
        topic_partitions: dict[str, int] | None = None,
        idempotence: bool = True,
        linger_ms: int = 5,
        max_batch_bytes: int = 1_048_576,
        request_timeout_ms: int = 30_000,
        breaker: CircuitBreaker | None = None,
        client_id: str = "reservo-relay",
        events: EventRegistry | None = None,
    ) -> None:
        self.bootstrap, self.source = bootstrap, source
        # Which topic (stream) and CloudEvents type each event name has.
        self.events = events or EventRegistry()
        self.partitions, self.replication_factor = partitions, replication_factor
        self.topic_partitions = topic_partitions or {}
        self.idempotence, self.linger_ms = idempotence, linger_ms
        self.max_batch_bytes, self.request_timeout_ms = max_batch_bytes, request_timeout_ms
        self.client_id = client_id
        self.breaker = breaker or CircuitBreaker(
            "kafka_producer", failure_threshold=3, window_s=30, reset_timeout_s=5
        )
        self._startup_topics = topics  # read at start(): modules subscribe during build
        self._known_topics: set[str] = set()
        self._producer: AIOKafkaProducer | None = None
        # One producer however many first deliveries arrive together (the results
        # webhook delivers per request): each used to start its own and leak it.
        self._starting = asyncio.Lock()

    async def start(self) -> None:
        """Connect and create the start-up topics (``deliver`` also does it lazily)."""
        await self._ensure_producer()
        await self._ensure_topics(self.events.streams(self._startup_topics()))

    async def stop(self) -> None:
        if self._producer is not None:
            producer, self._producer = self._producer, None
            await producer.stop()  # flushes what is still buffered

    async def _ensure_producer(self) -> AIOKafkaProducer:
        if self._producer is not None:
            return self._producer
        async with self._starting:
            if self._producer is not None:  # started while this one waited
                return self._producer
            producer = AIOKafkaProducer(
                bootstrap_servers=self.bootstrap,
                client_id=self.client_id,
                acks="all",
                enable_idempotence=self.idempotence,
                linger_ms=self.linger_ms,
                max_batch_size=self.max_batch_bytes,
                request_timeout_ms=self.request_timeout_ms,
                compression_type=None,
            )
            try:
                await producer.start()
            except BaseException:
                await producer.stop()
                raise
            self._producer = producer
            return producer

    async def _ensure_topics(self, topics: Iterable[str]) -> None:
        missing = set(topics) - self._known_topics
        if missing:
            await ensure_topics(
                self.bootstrap,
                missing,
                self.partitions,
                self.replication_factor,
                self.topic_partitions,
                timeout_ms=self.request_timeout_ms,
            )
            self._known_topics |= missing

    async def deliver(self, events: Sequence[Event]) -> list[BaseException | None]:
        n = len(events)
        try:
            self.breaker.before_call()
        except BreakerOpen as exc:
            return [TransportUnavailable(str(exc))] * n
        try:
            producer = await self._ensure_producer()
            await self._ensure_topics(self.events.streams(e.topic for e in events))
        except Exception as exc:  # broker unreachable: nothing was sent
            self._broker_failed()
            log.warning("kafka_unavailable", error=repr(exc))
            return [TransportUnavailable(repr(exc))] * n

        # Send everything first (records go to per-partition batches), then await all acks.
        pending: list[asyncio.Future[Any] | BaseException] = []
        for i, event in enumerate(events):
            headers, value = to_record(event, self.source, self.events.type_of(event.topic))
            try:
                pending.append(
                    await producer.send(
                        self.events.stream(event.topic),
                        value,
                        key=None if event.key is None else event.key.encode(),
                        headers=[*headers, *(trace_headers(event) or ())],
                    )
                )
            except Exception as exc:
                # send() blocks up to request_timeout_ms when it cannot even get
                # metadata: do not pay that once per remaining event.
                err = TransportUnavailable(repr(exc)) if _unavailable(exc) else exc
                if isinstance(err, TransportUnavailable):
                    pending.extend([err] * (n - i))
                    break
                pending.append(err)
        futures = [p for p in pending if not isinstance(p, BaseException)]
        acked = iter(await asyncio.gather(*futures, return_exceptions=True))
        results: list[BaseException | None] = []
        for event, p in zip(events, pending, strict=True):
            outcome = p if isinstance(p, BaseException) else next(acked)
            if isinstance(outcome, BaseException):
                results.append(
                    TransportUnavailable(repr(outcome)) if _unavailable(outcome) else outcome
                )
            else:
                results.append(None)
                KAFKA_PUBLISHED.labels(topic=event.topic).inc()
        if any(r is None for r in results) or not results:
            self.breaker.record_success()
        elif any(isinstance(r, TransportUnavailable) for r in results):
            self._broker_failed()
        return results

    def _broker_failed(self) -> None:
        self.breaker.record_failure()
        # A restarted broker may have lost its topics (Tansu keeps them in memory).
        self._known_topics.clear()


# -- trace context --------------------------------------------------------------------
# Beside the envelope, in the record's headers: ``traceparent`` (W3C Trace
# Context, as the Kafka instrumentations of OpenTelemetry read it) and
# ``x-request-id``, so a consumer that is not reservo's can follow them too.


def trace_headers(event: Event) -> list[tuple[str, bytes]] | None:
    """The record headers of the event's trace and request id (None: neither)."""
    traceparent = tracing.publishing(
        event.traceparent,
        f"{event.topic} publish",
        {"messaging.system": "kafka", "messaging.destination.name": event.topic},
    )
    headers = []
    if traceparent is not None:
        headers.append(("traceparent", traceparent.encode("ascii")))
    if event.request_id is not None:
        headers.append(("x-request-id", event.request_id.encode("ascii")))
    return headers or None
