"""In-process transport: the relay's own process runs the handlers.

Durable because the outbox row is marked done only after every handler of its
topic succeeded; a failing handler makes the relay retry the event later (other
handlers of that topic dedupe by event id through their inbox).

A subscription with a batch handler gets all the batch's events of its topic in
one call; if that fails, its events are replayed one by one through the plain
handler, so only the bad event is retried."""

from __future__ import annotations

import asyncio
from collections import defaultdict
from collections.abc import Sequence

import structlog

from reservo.core.transport.base import Event, Subscription, Subscriptions

log = structlog.get_logger(__name__)
Results = list[BaseException | None]


class LocalTransport:
    def __init__(self, subscriptions: Subscriptions) -> None:
        self.subscriptions = subscriptions

    async def start(self) -> None:
        return None

    async def stop(self) -> None:
        return None

    async def deliver(self, events: Sequence[Event]) -> Results:
        results: Results = [None] * len(events)
        by_topic: dict[str, list[tuple[int, Event]]] = defaultdict(list)
        for i, event in enumerate(events):
            by_topic[event.topic].append((i, event))
        await asyncio.gather(*(self._topic(items, results) for items in by_topic.values()))
        return results

    async def _topic(self, items: list[tuple[int, Event]], results: Results) -> None:
        for sub in self.subscriptions.for_topic(items[0][1].topic):
            # An event a previous subscription failed is retried as a whole later.
            pending = [(i, e) for i, e in items if results[i] is None]
            if not pending:
                return
            if sub.batch is not None:
                try:
                    await sub.batch([e for _, e in pending])
                    continue
                except Exception as exc:
                    self._failed(sub, pending[0][1], exc, batch=len(pending))
            await self._one_by_one(sub, pending, results)

    async def _one_by_one(
        self, sub: Subscription, items: list[tuple[int, Event]], results: Results
    ) -> None:
        by_key: dict[str, list[tuple[int, Event]]] = defaultdict(list)
        for i, event in items:
            by_key[event.key or str(event.id)].append((i, event))

        async def run_key(group: list[tuple[int, Event]]) -> None:
            # Events of one aggregate run in order; a failure holds back the rest.
            for n, (_, event) in enumerate(group):
                try:
                    await sub.handler(event)
                except Exception as exc:  # the relay retries; one bad event must not stop the rest
                    self._failed(sub, event, exc)
                    for later, _ in group[n:]:
                        results[later] = exc
                    return

        await asyncio.gather(*(run_key(group) for group in by_key.values()))

    @staticmethod
    def _failed(sub: Subscription, event: Event, exc: BaseException, batch: int = 1) -> None:
        log.warning(
            "handler_failed",
            consumer=sub.consumer,
            topic=event.topic,
            event_id=str(event.id),
            batch=batch,
            error=repr(exc),
        )
