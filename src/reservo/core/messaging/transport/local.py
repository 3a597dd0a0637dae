"""In-process transport: the relay's own process runs the handlers.

Every consumer of a topic gets every event, whatever the others do: each one has
its own progress. A consumer that fails transiently (its dependency is away)
makes the relay retry the event later; the consumers that succeeded dedupe the
redelivery through their inbox, so one consumer's outage delays no other. A
consumer that rejects the event (a permanent failure) gets it parked as its own
dead letter, and the event counts as delivered for everybody else."""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Sequence

import structlog

from reservo.core.kernel import metrics, tracing
from reservo.core.messaging.failures import is_transient
from reservo.core.messaging.ordering import by_key_in_order
from reservo.core.messaging.transport.base import Event, Subscriptions

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

    async def _deliver_one(self, event: Event) -> BaseException | None:
        """None when every consumer applied (or parked) the event, else the first
        transient failure, which makes the relay deliver it again later."""
        retry: BaseException | None = None
        for sub in self.subscriptions.for_topic(event.topic):
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

        async def deliver(item: tuple[int, Event]) -> None:
            index, event = item
            results[index] = await self._deliver_one(event)

        # Events of one aggregate run in order; different aggregates run concurrently.
        await by_key_in_order(enumerate(events), lambda item: _key(item[1]), deliver)
        return results


def _key(event: Event) -> str:
    return event.key or str(event.id)
