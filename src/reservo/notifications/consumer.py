"""The notifications consumer: turns events into messages and sends each one
on every channel its recipient has, outside any business transaction.

The channels: every address channel configured (``RESERVO_NOTIFY_CHANNEL``: the
log, e-mail over SMTP, SMS over HTTP; one message each) and Web Push (one
message per subscription of the recipient's contact). A (message, recipient,
channel, target) is one delivery, with its own row in the notification table
(the target names the push subscription; '' otherwise): the channel's inbox. A
message id is the event id, or one derived from it per item when an event
carries many messages (a settlement chunk).

Each delivery is tried once here. A sent one's row is written after its send,
already SENT (writing it PENDING first and marking it SENT after rewrote every
row: half the consumer's database time at 500,000 bets). A failed one gets a
PENDING row and a ``notification_retry`` job (deliveries.py) in one
transaction, and the event still succeeds: a channel that is down retries its
own deliveries with backoff, and holds neither the event nor the other
channels' messages (the relay keeps a key's later events behind a failed one).
A redelivered event skips the deliveries with a row: SENT and GONE are done, a
PENDING one is its retry job's (enqueued again, idempotently, should it be
missing). Rows carry their event's creation time, the table's partition key
(migration 0026): the same on every delivery, so the key holds."""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Mapping, Sequence
from datetime import timedelta
from typing import Any, NamedTuple
from uuid import UUID

import structlog

from reservo.core.db.database import Database, Queries
from reservo.core.jobqueue import JobQueue
from reservo.core.kernel import tracing
from reservo.core.kernel.clock import Clock
from reservo.core.messaging.notify import Notification
from reservo.core.messaging.transport.base import Event
from reservo.notifications import contacts
from reservo.notifications.channels import Channel
from reservo.notifications.errors import NotificationError
from reservo.notifications.push import PushChannel, SubscriptionGone
from reservo.notifications.subscriptions import PushSubscription

log = structlog.get_logger(__name__)
Q = Queries.load("reservo.notifications")

Renderer = Callable[[Event], list[Notification]]
CONSUMER = "notifications"
RETRY_JOB = "notification_retry"
# The first retry of a failed delivery comes this soon; deliveries.py backs off from there.
FIRST_RETRY = timedelta(seconds=1)


class Delivery(NamedTuple):
    """One message on one channel to one target (a tuple: a settlement chunk
    makes thousands)."""

    event: Event
    n: Notification
    channel: str
    target: str  # the push subscription's endpoint; '' for the other channels
    sub: PushSubscription | None


class NotificationConsumer:
    def __init__(
        self,
        db: Database,
        channel: Channel | Sequence[Channel],
        clock: Clock,
        renderers: Mapping[str, Renderer],
        concurrency: int = 32,
        *,
        push: PushChannel | None = None,
        jobs: JobQueue | None = None,
    ) -> None:
        self.db, self.clock = db, clock
        self.channels = [channel] if not isinstance(channel, Sequence) else list(channel)
        self.push = push
        # Where a failed delivery's retry goes; None (a test's bare consumer):
        # the failure fails the event, which the transport retries.
        self.jobs = jobs
        self.renderers = dict(renderers)
        # Sends in flight at once (a provider throttles a flood of connections).
        self._sending = asyncio.Semaphore(concurrency)

    @property
    def channel_names(self) -> list[str]:
        return [c.name for c in self.channels] + ([self.push.name] if self.push else [])

    @property
    def topics(self) -> list[str]:
        return sorted(self.renderers)

    async def handle(self, event: Event) -> None:
        await self.handle_many([event])

    async def handle_many(self, events: Sequence[Event]) -> None:
        """The sends of a batch: in order per aggregate (event key) and channel,
        aggregates and channels concurrently. One read first skips the
        deliveries that have a row; the sent ones are recorded after the sends,
        in one statement, as SENT: each row is written once. The failed ones
        are handed to their retry jobs; only a failure to record that fails the
        call (and the event is delivered again)."""
        messages = self._messages(events)
        if not messages:
            return
        deliveries, owned = await self._deliveries(messages)
        lanes: dict[tuple[str, str, str], list[int]] = {}
        for i, d in enumerate(deliveries):
            if i not in owned:
                lane = (d.event.key or str(d.event.id), d.channel, d.target)
                lanes.setdefault(lane, []).append(i)
        sent: list[int] = []
        gone: list[int] = []
        failed: dict[int, str] = {}
        try:
            outcomes = await asyncio.gather(
                *(
                    self._send_in_order(deliveries, lane, sent, gone, failed)
                    for lane in lanes.values()
                ),
                return_exceptions=True,
            )
        finally:  # also when cancelled: what was sent is not sent again
            await self._record(deliveries, sent, gone, failed, owned)
        if sent:
            log.info(
                "notifications_sent",
                events=len(events),
                first_event_id=str(events[0].id),
                count=len(sent),
                channels=self.channel_names,
            )
        for outcome in outcomes:  # not a channel's failure: a bug, raised as before
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

    async def _deliveries(
        self, messages: list[tuple[Event, Notification]]
    ) -> tuple[list[Delivery], set[int]]:
        """Every message on every channel its recipient has, addressed, and the
        indexes of the ones PENDING (their retry job's). The ones SENT or GONE
        are left out."""
        async with self.db.connection() as conn:
            # Addresses are read at send time: a contact changed after the event
            # was emitted is the one used.
            found = await contacts.of_many(conn, list({n.recipient_user_id for _, n in messages}))
            deliveries = _fan_out(messages, found, [c.name for c in self.channels], self.push)
            if not deliveries:  # no address channel, and no push subscription
                return [], set()
            times = [d.event.created_at for d in deliveries]
            done = await conn.fetch(
                Q.notification_recorded_before,
                [d.n.event_id for d in deliveries],
                [d.n.recipient_user_id for d in deliveries],
                [d.channel for d in deliveries],
                [d.target for d in deliveries],
                times,
                min(times),
                max(times),
            )
        status = {row[0] - 1: row[1] for row in done}
        if self.jobs is None:  # no retry jobs: a PENDING one is sent again here
            status = {i: st for i, st in status.items() if st != "PENDING"}
        kept: list[Delivery] = []
        owned: set[int] = set()
        for i, d in enumerate(deliveries):
            st = status.get(i)
            if st == "PENDING":
                owned.add(len(kept))
            if st is None or st == "PENDING":
                kept.append(d)
        return kept, owned

    async def _send_in_order(
        self,
        deliveries: list[Delivery],
        indexes: list[int],
        sent: list[int],
        gone: list[int],
        failed: dict[int, str],
    ) -> None:
        """One aggregate's messages on one channel (and target), one after the
        other. After a failure the rest of the lane goes to retry untried: the
        channel is likely down, and they keep their order behind the first."""
        # One slot per lane: its messages go one after the other anyway.
        async with self._sending:
            for at, i in enumerate(indexes):
                d = deliveries[i]
                # Each send in its event's trace, under the request id that
                # caused it (a batch mixes events of many requests).
                span = tracing.start(
                    f"notify {d.channel}",
                    "internal",
                    tracing.parent_for(d.event.traceparent),
                    {"messaging.message.id": d.n.event_id},
                    d.event.request_id,
                )
                try:
                    await self.send(d.channel, d.n, d.sub)
                except SubscriptionGone:
                    gone.extend(indexes[at:])  # the same subscription: all gone
                    return
                except NotificationError as exc:
                    span.fail(exc)
                    log.warning(
                        "notification_failed",
                        channel=d.channel,
                        event_id=d.n.event_id,
                        error=str(exc),
                    )
                    failed.update({j: str(exc) if j == i else f"after {exc}" for j in indexes[at:]})
                    return
                finally:
                    span.end()
                sent.append(i)

    async def send(self, channel: str, n: Notification, sub: PushSubscription | None) -> None:
        """One delivery on the named channel (also the retry jobs' way to send).
        Raises NotificationError, SubscriptionGone, or LookupError for a channel
        not configured (any more)."""
        if sub is not None:
            if self.push is None:
                raise LookupError("push is not configured")
            await self.push.send(n, sub)
            return
        for c in self.channels:
            if c.name == channel:
                await c.send(n)
                return
        raise LookupError(f"notify channel {channel!r} is not configured")

    async def _record(
        self,
        deliveries: list[Delivery],
        sent: list[int],
        gone: list[int],
        failed: dict[int, str],
        owned: set[int],
    ) -> None:
        """Sent ones in one statement; gone and failed ones, and the retry jobs
        of the failed and of the ones already PENDING, in one transaction."""
        if sent:
            await self._record_sent([deliveries[i] for i in sent])
        if not gone and not failed and not owned:
            return
        if self.jobs is None and failed:
            await self._record_failed([deliveries[i] for i in failed], list(failed.values()))
            raise NotificationError(next(e for e in failed.values() if e))
        jobs = self.jobs
        queued: list[Any] = []
        async with self.db.transaction() as conn:
            for i in gone:
                d = deliveries[i]
                await contacts.forget_push(conn, d.n.recipient_user_id, d.target)
            if gone:
                await self._write(
                    conn, Q.notification_gone, [deliveries[i] for i in gone], self.clock.now()
                )
            if failed:
                ds = [deliveries[i] for i in failed]
                await self._write(conn, Q.notification_failed, ds, list(failed.values()))
            if jobs is not None:
                run_at = self.clock.now() + FIRST_RETRY
                for i in [*failed, *owned]:
                    d = deliveries[i]
                    queued.append(
                        await jobs.enqueue(
                            RETRY_JOB,
                            retry_payload(d),
                            run_at=run_at,
                            idempotency_key=retry_key(d),
                            conn=conn,
                        )
                    )
        if jobs is not None and queued:
            await jobs.dispatch(queued)

    async def _record_failed(self, ds: list[Delivery], errors: list[str]) -> None:
        async with self.db.connection() as conn:
            await self._write(conn, Q.notification_failed, ds, errors)

    async def _record_sent(self, ds: list[Delivery]) -> None:
        async with self.db.connection() as conn:
            await self._write(conn, Q.notification_record_sent, ds, self.clock.now())

    async def _write(
        self, conn: Any, query: str, ds: list[Delivery], last: list[str] | object
    ) -> None:
        """Sent or gone (``last``: the time) or failed (PENDING, ``last``: their
        reasons) deliveries' rows."""
        await conn.execute(
            query,
            [d.n.event_id for d in ds],
            [d.event.topic for d in ds],
            [d.n.recipient_user_id for d in ds],
            [d.channel for d in ds],
            [d.target for d in ds],
            [d.n.subject for d in ds],
            [d.n.body for d in ds],
            [e[:2000] for e in last] if isinstance(last, list) else last,
            [d.event.created_at for d in ds],
        )


def retry_payload(d: Delivery) -> dict[str, Any]:
    """What a retry job names: the delivery's row (its key); the message is in it."""
    return {
        "eventId": d.n.event_id,
        "recipient": d.n.recipient_user_id,
        "channel": d.channel,
        "target": d.target,
        "eventCreatedAt": d.event.created_at.isoformat(),
    }


def retry_key(d: Delivery) -> str:
    # One retry job per delivery, whoever enqueues it (a redelivered event too).
    return f"notify:{d.n.event_id}:{d.n.recipient_user_id}:{d.channel}:{d.target}"


def _fan_out(
    messages: list[tuple[Event, Notification]],
    found: Mapping[int, contacts.Contact],
    channels: list[str],
    push: PushChannel | None,
) -> list[Delivery]:
    out: list[Delivery] = []
    for event, n in messages:
        contact = found.get(n.recipient_user_id)
        if contact is not None:
            n = n._replace(email=contact.email, phone=contact.phone)
        # Without a contact the address channels still send: to the channel's
        # default address (the e-mail template, the user id for SMS).
        out.extend([Delivery(event, n, name, "", None) for name in channels])
        if push is not None and contact is not None:
            out.extend([Delivery(event, n, push.name, s.endpoint, s) for s in contact.push])
    return out
