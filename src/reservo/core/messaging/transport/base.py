"""The transport interface. Handlers never know which transport delivered an event."""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any, Protocol
from uuid import UUID


@dataclass(frozen=True)
class Event:
    id: UUID
    topic: str
    key: str | None
    payload: dict[str, Any]
    created_at: datetime
    # The trace and request the event was emitted in (core/kernel/tracing.py): the
    # consumers' work on it continues that trace, under that request id.
    traceparent: str | None = None
    request_id: str | None = None


Handler = Callable[[Event], Awaitable[None]]
# Applies many events (of the consumer's topics, in delivery order) in one go:
# one transaction, one statement per table. What lets a consumer keep up with
# thousands of events a second. Same effect as the Handler on each in turn.
BatchHandler = Callable[[Sequence[Event]], Awaitable[None]]


@dataclass(frozen=True)
class Subscription:
    consumer: str
    topic: str
    handler: Handler
    # Optional fast path for the Kafka consumer runner and the local transport;
    # both fall back to ``handler`` one event at a time when a batch fails, so
    # one bad event is isolated (retried, parked).
    batch: BatchHandler | None = None


class Subscriptions:
    """Which consumer handles which topic; filled by the composition root."""

    def __init__(self) -> None:
        self._by_topic: dict[str, list[Subscription]] = defaultdict(list)

    def add(
        self,
        consumer: str,
        topics: Sequence[str],
        handler: Handler,
        batch: BatchHandler | None = None,
    ) -> None:
        for topic in topics:
            self._by_topic[topic].append(Subscription(consumer, topic, handler, batch))

    def for_topic(self, topic: str) -> list[Subscription]:
        return self._by_topic.get(topic, [])

    def topics(self) -> list[str]:
        return sorted(self._by_topic)

    def consumers(self) -> list[str]:
        return sorted({s.consumer for subs in self._by_topic.values() for s in subs})

    def for_consumer(self, consumer: str) -> dict[str, Subscription]:
        """Topic -> subscription of one consumer (a Kafka consumer group runs exactly these)."""
        return {
            s.topic: s for subs in self._by_topic.values() for s in subs if s.consumer == consumer
        }


class TransportUnavailable(Exception):
    """The transport as a whole is down (broker unreachable, breaker open): the relay
    puts the event back without counting an attempt, so an outage never kills events."""


class Transport(Protocol):
    """Takes a batch of claimed outbox events; returns, per event, None when it is
    safely delivered (the relay then marks the row done) or the error to retry."""

    async def start(self) -> None: ...

    async def stop(self) -> None: ...

    async def deliver(self, events: Sequence[Event]) -> list[BaseException | None]: ...
