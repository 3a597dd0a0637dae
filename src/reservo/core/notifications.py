"""The notifications consumer: turns events into messages and sends them
through the configured channel, outside any business transaction.

Its table is its inbox: one row per (event, recipient). A row already SENT is
skipped, so a redelivered event is not sent twice; a failed send raises, and the
transport retries the event later."""

from __future__ import annotations

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
        for n in render(event):
            async with self.db.connection() as conn:
                row = await conn.fetchrow(
                    Q.notification_upsert,
                    event.id,
                    event.topic,
                    n.recipient_user_id,
                    self.channel.name,
                    n.subject,
                    n.body,
                )
            if row["status"] == "SENT":
                continue
            try:
                await self.channel.send(n)
            except NotificationError as exc:
                async with self.db.connection() as conn:
                    await conn.execute(Q.notification_failed, row["id"], str(exc)[:2000])
                raise
            async with self.db.connection() as conn:
                await conn.execute(Q.notification_sent, row["id"], self.clock.now())
            log.info(
                "notification_sent",
                event_id=str(event.id),
                topic=event.topic,
                recipient=n.recipient_user_id,
                channel=self.channel.name,
            )
