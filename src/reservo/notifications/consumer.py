"""The notifications consumer: turns events into messages and sends them
through the configured channel, outside any business transaction.

Its table is its inbox: one row per (message id, recipient). A message id is the
event id, or one derived from it per item when an event carries many messages (a
settlement chunk). A row already SENT is skipped, so a redelivered event is not
sent twice; a failed send leaves a PENDING row with its reason and raises, and
the transport retries the event later. A sent message's row is written once,
after its send, already SENT (writing it PENDING first and marking it SENT
after rewrote every row: half the consumer's database time at 500,000 bets).
Rows carry their event's creation time, the table's partition key (migration
0026): the same on every delivery, so the (message id, recipient) key holds."""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Mapping, Sequence
from uuid import UUID

import structlog

from reservo.core.db.database import Database, Queries
from reservo.core.kernel import tracing
from reservo.core.kernel.clock import Clock
from reservo.core.messaging.notify import Notification
from reservo.core.messaging.transport.base import Event
from reservo.notifications import contacts
from reservo.notifications.channels import Channel, NotificationError

log = structlog.get_logger(__name__)
Q = Queries.load("reservo.notifications")

Renderer = Callable[[Event], list[Notification]]
CONSUMER = "notifications"


class NotificationConsumer:
    def __init__(
        self,
        db: Database,
        channel: Channel,
        clock: Clock,
        renderers: Mapping[str, Renderer],
        concurrency: int = 32,
    ) -> None:
        self.db, self.channel, self.clock = db, channel, clock
        self.renderers = dict(renderers)
        # Sends in flight at once (a provider throttles a flood of connections).
        self._sending = asyncio.Semaphore(concurrency)

    @property
    def topics(self) -> list[str]:
        return sorted(self.renderers)

    async def handle(self, event: Event) -> None:
        await self.handle_many([event])

    async def handle_many(self, events: Sequence[Event]) -> None:
        """The sends of a batch: in order per aggregate (event key), aggregates
        concurrently, as the transports do for events. One read first skips the
        messages already SENT (a redelivered event); the sent ones are recorded
        after the sends, in one statement, as SENT: each row is written once. A
        message id seen twice (a redelivered event in the same batch) is sent
        once. Any failed send fails the call, after the others."""
        messages = self._messages(events)
        if not messages:
            return
        messages, skip = await self._addressed_and_sent(messages)
        by_key: dict[str, list[int]] = {}
        for i, (event, _) in enumerate(messages):
            if i not in skip:
                by_key.setdefault(event.key or str(event.id), []).append(i)
        sent: list[int] = []
        try:
            outcomes = await asyncio.gather(
                *(self._send_in_order(messages, group, sent) for group in by_key.values()),
                return_exceptions=True,
            )
        finally:
            if sent:
                await self._record_sent([messages[i] for i in sent])
                log.info(
                    "notifications_sent",
                    events=len(events),
                    first_event_id=str(events[0].id),
                    count=len(sent),
                    channel=self.channel.name,
                )
        for outcome in outcomes:  # the first failure, in the order the keys first appear
            if isinstance(outcome, BaseException):
                raise outcome

    def _messages(self, events: Sequence[Event]) -> list[tuple[Event, Notification]]:
        messages: list[tuple[Event, Notification]] = []
        seen: set[UUID] = set()
        for event in events:
            render = self.renderers.get(event.topic)
            # A renderer's messages are distinct (message id, recipient) pairs and
            # their ids derive from the event's: deduplicating by event suffices
            # (a set of pairs cost a tenth of the consumer at 5,000 per event).
            if render is not None and event.id not in seen:
                seen.add(event.id)
                messages.extend([(event, n) for n in render(event)])
        return messages

    async def _addressed_and_sent(
        self, messages: list[tuple[Event, Notification]]
    ) -> tuple[list[tuple[Event, Notification]], set[int]]:
        """The messages with their recipients' addresses, and the indexes of the
        ones already SENT."""
        async with self.db.connection() as conn:
            # Addresses are read at send time: a contact changed after the event
            # was emitted is the one used.
            found = await contacts.of_many(conn, list({n.recipient_user_id for _, n in messages}))
            # the ids as text: asyncpg parses them (a UUID object each cost more)
            times = [event.created_at for event, _ in messages]
            done = await conn.fetch(
                Q.notification_sent_before,
                [n.event_id for _, n in messages],
                [n.recipient_user_id for _, n in messages],
                times,
                min(times),
                max(times),
            )
        if found:
            messages = [
                (event, _addressed(n, found.get(n.recipient_user_id))) for event, n in messages
            ]
        return messages, {row[0] - 1 for row in done}

    async def _send_in_order(
        self, messages: list[tuple[Event, Notification]], indexes: list[int], sent: list[int]
    ) -> None:
        """One aggregate's messages, one after the other; each sent one's index
        is added to ``sent``."""
        # One slot per aggregate: its messages go one after the other anyway,
        # so this bounds the sends in flight as one slot per message did,
        # without a semaphore round per message.
        async with self._sending:
            for i in indexes:
                event, n = messages[i]
                # Each send in its event's trace, under the request id that
                # caused it (a batch mixes events of many requests).
                send = tracing.start(
                    f"notify {self.channel.name}",
                    "internal",
                    tracing.parent_for(event.traceparent),
                    {"messaging.message.id": n.event_id},
                    event.request_id,
                )
                try:
                    await self.channel.send(n)
                except NotificationError as exc:
                    send.fail(exc)
                    await self._record_failed(event, n, exc)
                    raise
                finally:
                    send.end()
                sent.append(i)

    async def _record_failed(self, event: Event, n: Notification, exc: Exception) -> None:
        async with self.db.connection() as conn:
            await conn.execute(
                Q.notification_failed,
                n.event_id,
                event.topic,
                n.recipient_user_id,
                self.channel.name,
                n.subject,
                n.body,
                str(exc)[:2000],
                event.created_at,
            )

    async def _record_sent(self, messages: list[tuple[Event, Notification]]) -> None:
        async with self.db.connection() as conn:
            await conn.execute(
                Q.notification_record_sent,
                [n.event_id for _, n in messages],
                [event.topic for event, _ in messages],
                [n.recipient_user_id for _, n in messages],
                self.channel.name,
                [n.subject for _, n in messages],
                [n.body for _, n in messages],
                self.clock.now(),
                [event.created_at for event, _ in messages],
            )


def _addressed(n: Notification, contact: contacts.Contact | None) -> Notification:
    if contact is None:
        return n
    return n._replace(email=contact.email, phone=contact.phone)
