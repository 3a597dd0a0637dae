"""Retries of failed deliveries, one channel's on its own: a
``notification_retry`` job per delivery (consumer.py enqueues it with the
PENDING row, in one transaction), run by the scheduler.

The job reads its delivery's row: a row no longer PENDING (sent by an earlier
run, gone) ends it, so a message is never sent twice on a channel by its
retries. A send that fails again counts an attempt on the row and puts the job
back with capped, jittered backoff (``JobDeferred``: not a scheduler attempt,
so an outage of any length loses nothing). A channel that is down delays only
its own deliveries: nothing else waits for these jobs."""

from __future__ import annotations

from datetime import datetime
from typing import Any
from uuid import UUID

import structlog
from pydantic import BaseModel, ConfigDict, Field

from reservo.core.aio.backoff import backoff_delay
from reservo.core.db.database import Database, Queries
from reservo.core.kernel.clock import Clock
from reservo.core.messaging.notify import Notification
from reservo.notifications import contacts
from reservo.notifications.consumer import NotificationConsumer
from reservo.notifications.errors import NotificationError
from reservo.notifications.push import SubscriptionGone
from reservo.scheduler import JobDeferred

log = structlog.get_logger(__name__)
Q = Queries.load("reservo.notifications")


class RetryJob(BaseModel):
    """A retry job's payload: its delivery's key (consumer.retry_payload)."""

    model_config = ConfigDict(extra="forbid", populate_by_name=True)

    event_id: UUID = Field(alias="eventId")
    recipient: int
    channel: str
    target: str
    event_created_at: datetime = Field(alias="eventCreatedAt")


class DeliveryRetries:
    def __init__(
        self,
        db: Database,
        consumer: NotificationConsumer,
        clock: Clock,
        backoff_base_s: float = 5.0,
        backoff_max_s: float = 300.0,
    ) -> None:
        self.db, self.consumer, self.clock = db, consumer, clock
        self.backoff_base_s, self.backoff_max_s = backoff_base_s, backoff_max_s

    async def __call__(self, job: Any) -> None:
        p = RetryJob.model_validate(job.payload)
        key = (p.event_id, p.recipient, p.channel, p.target, p.event_created_at)
        async with self.db.connection() as conn:
            row = await conn.fetchrow(Q.notification_delivery, *key)
            if row is None or row["status"] != "PENDING":
                return
            contact = (await contacts.of_many(conn, [p.recipient])).get(p.recipient)
        n = Notification(
            p.recipient,
            row["subject"],
            row["body"],
            str(p.event_id),
            contact.email if contact else None,
            contact.phone if contact else None,
        )
        sub = None
        if p.target:
            subs = contact.push if contact else ()
            sub = next((s for s in subs if s.endpoint == p.target), None)
            if sub is None:  # the user replaced their subscriptions meanwhile
                await self._settle(key, "GONE", "the push subscription was removed")
                return
        try:
            await self.consumer.send(p.channel, n, sub)
        except SubscriptionGone as exc:
            async with self.db.transaction() as conn:
                await contacts.forget_push(conn, p.recipient, p.target)
                await self._settle(key, "GONE", str(exc), conn)
            return
        except NotificationError as exc:
            attempts = await self._settle(key, "PENDING", str(exc)[:2000])
            delay = backoff_delay(attempts, self.backoff_base_s, self.backoff_max_s)
            log.warning(
                "notification_retry_failed",
                channel=p.channel,
                event_id=str(p.event_id),
                attempts=attempts,
                retry_in_s=round(delay, 1),
                error=str(exc),
            )
            raise JobDeferred(f"notify {p.channel}: {exc}", delay) from exc
        await self._settle(key, "SENT", None)
        log.info("notification_retry_sent", channel=p.channel, event_id=str(p.event_id))

    async def _settle(
        self, key: tuple[Any, ...], status: str, error: str | None, conn: Any = None
    ) -> int:
        """The row's new state; the attempts it has counted (0: it was not PENDING)."""
        if conn is None:
            async with self.db.connection() as own:
                return await self._settle(key, status, error, own)
        now = self.clock.now()
        attempts = await conn.fetchval(Q.notification_retried, *key, status, now, error)
        return int(attempts or 0)
