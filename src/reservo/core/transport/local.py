"""In-process transport: the relay's own process runs the handlers.

Durable because the outbox row is marked done only after every handler of its
topic succeeded; a failing handler makes the relay retry the event later (other
handlers of that topic dedupe by event id through their inbox).

A consumer with a batch handler gets all the batch's events of its topics in one
call, in outbox order; if that fails, they are replayed one by one through the
plain handler, so only the bad event (and what follows it for its key) is retried."""

from __future__ import annotations

import asyncio
from collections import defaultdict
from collections.abc import Sequence

import structlog

from reservo.core.transport.base import Event, Subscription, Subscriptions

log = structlog.get_logger(__name__)
Results = list[BaseException | None]
Item = tuple[int, Event, Subscription]  # position in the batch, event, who handles it


class LocalTransport:
    def __init__(self, subscriptions: Subscriptions) -> None:
        self.subscriptions = subscriptions

    async def start(self) -> None:
        return None

    async def stop(self) -> None:
        return None

    async def deliver(self, events: Sequence[Event]) -> Results:
        results: Results = [None] * len(events)
        # Each consumer sees its events in outbox order (per-key order holds
        # across topics too); consumers are independent and run concurrently.
        by_consumer: dict[str, list[Item]] = defaultdict(list)
        for i, event in enumerate(events):
            for sub in self.subscriptions.for_topic(event.topic):
                by_consumer[sub.consumer].append((i, event, sub))
        await asyncio.gather(*(self._consumer(items, results) for items in by_consumer.values()))
        return results

    async def _consumer(self, items: list[Item], results: Results) -> None:
        batch = items[0][2].batch
        if batch is not None and all(sub.batch == batch for _, _, sub in items):
            try:
                await batch([event for _, event, _ in items])
                return
            except Exception as exc:  # replay one by one: only the bad event is retried
                self._failed(items[0][2], items[0][1], exc, batch=len(items))
        by_key: dict[str, list[Item]] = defaultdict(list)
        for item in items:
            by_key[item[1].key or str(item[1].id)].append(item)

        async def run_key(group: list[Item]) -> None:
            # Events of one aggregate run in order; a failure holds back the rest.
            for n, (_, event, sub) in enumerate(group):
                try:
                    await sub.handler(event)
                except Exception as exc:  # the relay retries; one bad event must not stop the rest
                    self._failed(sub, event, exc)
                    for later, _, _ in group[n:]:
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
