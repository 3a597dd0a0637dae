"""The notifications consumer: turns events into messages and sends them
through the configured channel, outside any business transaction.

Its table is its inbox: one row per (message id, recipient). A message id is the
event id, or one derived from it per item when an event carries many messages (a
settlement chunk). A row already SENT is skipped, so a redelivered event is not
sent twice; a failed send raises, and the transport retries the event later."""

from __future__ import annotations

import uuid
from collections.abc import Callable, Mapping

import structlog

from reservo.core.clock import Clock
from reservo.core.db import Database, Queries
from reservo.core.notify import Channel, Notification, NotificationError
from reservo.core.transport.base import Event

log = structlog.get_logger(__name__)
Q = Queries.load("reservo.core")

Renderer = Callable[[Event], list[Notification]]
CONSUMER = "notifications"


class NotificationConsumer:
    def __init__(
        self, db: Database, channel: Channel, clock: Clock, renderers: Mapping[str, Renderer]
    ) -> None:
        self.db, self.channel, self.clock = db, channel, clock
        self.renderers = dict(renderers)

    @property
    def topics(self) -> list[str]:
        return sorted(self.renderers)

    async def handle(self, event: Event) -> None:
        render = self.renderers.get(event.topic)
        if render is None:
            return
        messages = render(event)
        if not messages:
            return
        async with self.db.connection() as conn:
            rows = await conn.fetch(
                Q.notification_upsert,
                [uuid.UUID(n.event_id) for n in messages],
                [event.topic] * len(messages),
                [n.recipient_user_id for n in messages],
                [self.channel.name] * len(messages),
                [n.subject for n in messages],
                [n.body for n in messages],
            )
        pending = [
            (row["id"], n) for row, n in zip(rows, messages, strict=True) if row["status"] != "SENT"
        ]
        sent: list[int] = []
        try:
            for row_id, n in pending:
                try:
                    await self.channel.send(n)
                except NotificationError as exc:
                    async with self.db.connection() as conn:
                        await conn.execute(Q.notification_failed, row_id, str(exc)[:2000])
                    raise
                sent.append(row_id)
        finally:
            if sent:
                async with self.db.connection() as conn:
                    await conn.execute(Q.notification_sent, sent, self.clock.now())
                log.info(
                    "notifications_sent",
                    event_id=str(event.id),
                    topic=event.topic,
                    count=len(sent),
                    channel=self.channel.name,
                )
