"""The notifications consumer: turns events into messages and sends them
through the configured channel, outside any business transaction.

Its table is its inbox: one row per (message id, recipient). A message id is the
event id, or one derived from it per item when an event carries many messages (a
settlement chunk). A row already SENT is skipped, so a redelivered event is not
sent twice; a failed send raises, and the transport retries the event later.
Rows carry their event's creation time, the table's partition key (migration
0026): the same on every delivery, so the (message id, recipient) key holds."""

from __future__ import annotations

import asyncio
import dataclasses
from collections.abc import Callable, Mapping, Sequence
from datetime import datetime

import structlog

from reservo.core import contacts
from reservo.core.clock import Clock
from reservo.core.db import Database, Queries
from reservo.core.notify import Channel, Notification, NotificationError
from reservo.core.ordering import by_key_in_order
from reservo.core.transport.base import Event

log = structlog.get_logger(__name__)
Q = Queries.load("reservo.core")

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
        """Every message of the batch in one upsert, then the sends: in order per
        aggregate (event key), aggregates concurrently, as the transports do for
        events. A message id seen twice (a redelivered event in the same batch)
        is recorded once. Any failed send fails the call, after the others."""
        messages: list[tuple[Event, Notification]] = []
        seen: set[tuple[str, int]] = set()
        for event in events:
            render = self.renderers.get(event.topic)
            for n in render(event) if render is not None else ():
                if (n.event_id, n.recipient_user_id) not in seen:
                    seen.add((n.event_id, n.recipient_user_id))
                    messages.append((event, n))
        if not messages:
            return
        async with self.db.connection() as conn:
            # Addresses are read at send time: a contact changed after the event
            # was emitted is the one used.
            found = await contacts.of_many(conn, list({n.recipient_user_id for _, n in messages}))
            messages = [
                (event, _addressed(n, found.get(n.recipient_user_id))) for event, n in messages
            ]
            rows = await conn.fetch(
                Q.notification_upsert,
                # the ids as text: asyncpg parses them (a UUID object each cost more)
                [n.event_id for _, n in messages],
                [event.topic for event, _ in messages],
                [n.recipient_user_id for _, n in messages],
                [self.channel.name] * len(messages),
                [n.subject for _, n in messages],
                [n.body for _, n in messages],
                [event.created_at for event, _ in messages],
            )
        unsent = [
            (event.key or str(event.id), row["id"], event.created_at, n)
            for row, (event, n) in zip(rows, messages, strict=True)
            if row["status"] != "SENT"
        ]
        sent: list[int] = []
        # The rows' partition key (their events' creation times): the updates
        # below probe only those days' partitions.
        times = [created for _, _, created, _ in unsent]

        async def send(item: tuple[str, int, datetime, Notification]) -> None:
            _, row_id, created, n = item
            async with self._sending:
                try:
                    await self.channel.send(n)
                except NotificationError as exc:
                    async with self.db.connection() as conn:
                        await conn.execute(Q.notification_failed, row_id, str(exc)[:2000], created)
                    raise
            sent.append(row_id)

        try:
            failures = await by_key_in_order(unsent, lambda item: item[0], send)
        finally:
            if sent:
                async with self.db.connection() as conn:
                    await conn.execute(
                        Q.notification_sent, sent, self.clock.now(), min(times), max(times)
                    )
                log.info(
                    "notifications_sent",
                    events=len(events),
                    first_event_id=str(events[0].id),
                    count=len(sent),
                    channel=self.channel.name,
                )
        if failures:
            raise failures[0]


def _addressed(n: Notification, contact: contacts.Contact | None) -> Notification:
    if contact is None:
        return n
    return dataclasses.replace(n, email=contact.email, phone=contact.phone)
