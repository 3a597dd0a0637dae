"""In-process transport: the relay's own process runs the handlers.

Durable because the outbox row is marked done only after every handler of its
topic succeeded; a failing handler makes the relay retry the event later (other
handlers of that topic dedupe by event id through their inbox)."""

from __future__ import annotations

import asyncio
from collections import defaultdict
from collections.abc import Sequence

import structlog

from reservo.core.transport.base import Event, Subscriptions

log = structlog.get_logger(__name__)


class LocalTransport:
    def __init__(self, subscriptions: Subscriptions) -> None:
        self.subscriptions = subscriptions

    async def start(self) -> None:
        return None

    async def stop(self) -> None:
        return None

    async def _deliver_one(self, event: Event) -> BaseException | None:
        for sub in self.subscriptions.for_topic(event.topic):
            try:
                await sub.handler(event)
            except Exception as exc:  # the relay retries; one bad event must not stop the rest
                log.warning(
                    "handler_failed",
                    consumer=sub.consumer,
                    topic=event.topic,
                    event_id=str(event.id),
                    error=repr(exc),
                )
                return exc
        return None

    async def _deliver_key(
        self, events: list[tuple[int, Event]], results: list[BaseException | None]
    ) -> None:
        # Events of one aggregate run in order; different aggregates run concurrently.
        for index, event in events:
            results[index] = await self._deliver_one(event)

    async def deliver(self, events: Sequence[Event]) -> list[BaseException | None]:
        results: list[BaseException | None] = [None] * len(events)
        by_key: dict[str, list[tuple[int, Event]]] = defaultdict(list)
        for i, event in enumerate(events):
            by_key[event.key or str(event.id)].append((i, event))
        await asyncio.gather(*(self._deliver_key(group, results) for group in by_key.values()))
        return results
