"""The parts every module is built from, and the core pieces built from settings.

``Shared`` is what a module's ``setup(shared)`` receives: the pool, Redis and its
filters, the idempotency store, the job queue every module may enqueue into
(``core.jobqueue.JobQueue``: the root picks its implementation, the scheduler
module's), and the settings. The ``*_from_settings`` helpers turn settings into plain
values for core (core never imports ``reservo.settings``)."""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass, field

from reservo.core.db.database import Database
from reservo.core.db.replicas import StaleReads
from reservo.core.http.idempotency import IdempotencyStore
from reservo.core.jobqueue import JobQueue
from reservo.core.kernel.clock import Clock
from reservo.core.kernel.contract import EventRegistry
from reservo.core.messaging.transport.base import Subscription, Subscriptions
from reservo.core.messaging.transport.kafka import KafkaConsumerRunner, KafkaTransport
from reservo.core.redis.cache import Cache
from reservo.core.redis.client import Client, RedisGate
from reservo.core.redis.ratelimit import RateLimiter
from reservo.settings import Settings


@dataclass(frozen=True, kw_only=True)
class Shared:
    settings: Settings
    clock: Clock
    db: Database
    # The reads that may be seconds stale: on a replica when there are.
    stale: StaleReads
    redis: Client
    gate: RedisGate
    cache: Cache
    limiter: RateLimiter
    idempotency: IdempotencyStore
    scheduler: JobQueue
    # Which consumer handles which topic: filled by the composition root from
    # every module's ``consumes`` once all are built (transports and the
    # dead-letter replay read it).
    subscriptions: Subscriptions
    # Every event the modules declare (filled by the composition root like the
    # subscriptions): the Kafka transports read each event's topic off it.
    events: EventRegistry = field(default_factory=EventRegistry)
    # Log the start-up warnings (off when the graph is built only to read it).
    announce: bool = True


def transport_from_settings(
    settings: Settings,
    topics: Callable[[], Iterable[str]],
    events: EventRegistry,
    *,
    request_timeout_ms: int | None = None,
    client_id: str = "reservo-relay",
) -> KafkaTransport:
    assert settings.kafka_bootstrap, "RESERVO_KAFKA_BOOTSTRAP is not set"
    return KafkaTransport(
        settings.kafka_bootstrap,
        source=settings.kafka_source,
        topics=topics,
        partitions=settings.kafka_partitions,
        replication_factor=settings.kafka_replication_factor,
        topic_partitions=_by_stream(settings, events),
        idempotence=settings.kafka_idempotence,
        linger_ms=settings.kafka_linger_ms,
        request_timeout_ms=(
            settings.kafka_request_timeout_ms if request_timeout_ms is None else request_timeout_ms
        ),
        client_id=client_id,
        events=events,
    )


def consumer_from_settings(
    settings: Settings,
    consumer: str,
    subscriptions: dict[str, Subscription],
    db: Database,
    clock: Clock,
    events: EventRegistry,
) -> KafkaConsumerRunner:
    assert settings.kafka_bootstrap, "RESERVO_KAFKA_BOOTSTRAP is not set"
    return KafkaConsumerRunner(
        settings.kafka_bootstrap,
        consumer,
        {topic: sub.handler for topic, sub in subscriptions.items()},
        db,
        clock,
        group_prefix=settings.kafka_group_prefix,
        partitions=settings.kafka_partitions,
        replication_factor=settings.kafka_replication_factor,
        topic_partitions=_by_stream(settings, events),
        quick_retries=settings.kafka_consumer_quick_retries,
        backoff_base_s=settings.kafka_consumer_backoff_base_s,
        backoff_max_s=settings.kafka_consumer_backoff_max_s,
        dead_letter_topic=settings.kafka_dead_letter_topic,
        idempotence=settings.kafka_idempotence,
        max_records=settings.kafka_consumer_max_records,
        session_timeout_ms=settings.kafka_session_timeout_ms,
        request_timeout_ms=settings.kafka_request_timeout_ms,
        concurrency=settings.kafka_consumer_concurrency,
        batch_handlers={t: sub.batch for t, sub in subscriptions.items() if sub.batch is not None},
        events=events,
        source=settings.kafka_source,
        legacy_topics=settings.kafka_legacy_topics,
    )


def _by_stream(settings: Settings, events: EventRegistry) -> dict[str, int]:
    """RESERVO_KAFKA_TOPIC_PARTITIONS by topic; an event's name (old or new)
    stands for its stream, so a setting written for the old topics still holds."""
    return {events.stream(name): n for name, n in settings.kafka_topic_partitions.items()}
