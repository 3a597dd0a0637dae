"""In-process transport: the relay's own process runs the handlers.

Every consumer of a topic gets every event, whatever the others do: each one has
its own progress. A consumer that fails transiently (its dependency is away)
makes the relay retry the event later; the consumers that succeeded dedupe the
redelivery through their inbox, so one consumer's outage delays no other. A
consumer that rejects the event (a permanent failure) gets it parked as its own
dead letter, and the event counts as delivered for everybody else.

A consumer with a batch handler gets its events of a relay batch in one call
(one transaction, a statement per table, instead of each of them per event):
the settled-bet notifications of a results burst came one event, three
statements, at a time and fell tens of seconds behind the settlement. Each
event still gets its consumer span, in its own trace. A batch that fails
applied nothing, and its events take the one-by-one path, which retries and
parks each on its own (as the Kafka consumer does)."""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Collection, Sequence
from dataclasses import replace

import structlog

from reservo.core.kernel import metrics, tracing
from reservo.core.messaging.failures import is_transient
from reservo.core.messaging.ordering import by_key_in_order
from reservo.core.messaging.transport.base import BatchHandler, Event, Subscriptions

log = structlog.get_logger(__name__)

# Records an event a consumer rejected: (consumer, event, error).
Park = Callable[[str, Event, BaseException], Awaitable[None]]


class LocalTransport:
    def __init__(self, subscriptions: Subscriptions, park: Park) -> None:
        self.subscriptions = subscriptions
        self.park = park

    async def start(self) -> None:
        return None

    async def stop(self) -> None:
        return None

    async def _deliver_one(self, event: Event, batched: Collection[str]) -> BaseException | None:
        """None when every consumer applied (or parked) the event, else the first
        transient failure, which makes the relay deliver it again later. The
        ``batched`` consumers applied it already."""
        retry: BaseException | None = None
        for sub in self.subscriptions.for_topic(event.topic):
            if sub.consumer in batched:
                continue
            try:
                # The handler's work, its log lines and its outbound calls in the
                # event's trace, under the request id that caused it.
                with tracing.handling(
                    event.traceparent,
                    event.request_id,
                    f"{event.topic} process",
                    {
                        "messaging.destination.name": event.topic,
                        "messaging.consumer.group.name": sub.consumer,
                        "messaging.message.id": str(event.id),
                    },
                ):
                    await sub.handler(event)
                continue
            except Exception as exc:
                failure: BaseException = exc
            if not is_transient(failure):
                try:
                    await self.park(sub.consumer, event, failure)
                    continue
                except Exception as exc:  # cannot even park it (database away): retry
                    failure = exc
            metrics.TRANSIENT_FAILURES.labels(consumer=sub.consumer).inc()
            log.warning(
                "handler_retrying",
                consumer=sub.consumer,
                topic=event.topic,
                event_id=str(event.id),
                error=repr(failure),
            )
            retry = retry or failure
        return retry

    async def deliver(self, events: Sequence[Event]) -> list[BaseException | None]:
        results: list[BaseException | None] = [None] * len(events)
        batched: set[str] = set()
        for consumer, (batch, theirs) in self._batches(events).items():
            if await self._try_batch(consumer, batch, theirs):
                batched.add(consumer)

        async def deliver(item: tuple[int, Event]) -> None:
            index, event = item
            results[index] = await self._deliver_one(event, batched)

        # Events of one aggregate run in order; different aggregates run concurrently.
        await by_key_in_order(enumerate(events), lambda item: _key(item[1]), deliver)
        return results

    def _batches(self, events: Sequence[Event]) -> dict[str, tuple[BatchHandler, list[Event]]]:
        """Per consumer whose one batch handler takes every event of the batch it
        handles: that handler and those events, in delivery order."""
        found: dict[str, tuple[BatchHandler, list[Event]]] = {}
        one_by_one: set[str] = set()
        for event in events:
            for sub in self.subscriptions.for_topic(event.topic):
                had = found.get(sub.consumer)
                if sub.batch is None or (had is not None and had[0] != sub.batch):
                    one_by_one.add(sub.consumer)
                elif had is None:
                    found[sub.consumer] = (sub.batch, [event])
                else:
                    had[1].append(event)
        return {c: b for c, b in found.items() if c not in one_by_one}

    async def _try_batch(self, consumer: str, batch: BatchHandler, events: list[Event]) -> bool:
        """The consumer's events through its batch handler, each under a consumer
        span of its own trace (the events it hands on name that span as their
        parent); False (nothing applied) sends them down the one-by-one path."""
        spans = [
            tracing.handling_detached(
                e.traceparent,
                f"{e.topic} process",
                {
                    "messaging.destination.name": e.topic,
                    "messaging.consumer.group.name": consumer,
                    "messaging.message.id": str(e.id),
                },
            )
            for e in events
        ]
        try:
            await batch(
                [
                    replace(e, traceparent=s.context.traceparent)
                    for e, s in zip(events, spans, strict=True)
                ]
            )
        except Exception as exc:
            for span in spans:
                span.fail(exc)
            log.warning("batch_failed", consumer=consumer, events=len(events), error=repr(exc))
            return False
        finally:
            for span in spans:
                span.end()
        return True


def _key(event: Event) -> str:
    return event.key or str(event.id)
