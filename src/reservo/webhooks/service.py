"""Use cases of outgoing webhooks: the endpoints admins manage, the fan-out of
every event into deliveries (the ``webhooks`` consumer), and each delivery
attempt (a scheduler job of category ``webhooks.deliver``).

A delivery's attempts are jobs, one per turn: an attempt that fails records
itself and, in the same transaction, enqueues the next turn at its backoff
time; a redelivery starts a new turn, and a job of a turn that is no longer the
delivery's does nothing. The HTTP call never runs inside a transaction: the
attempt reads what it needs, releases the connection, calls, then records."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import asyncpg
import structlog
from pydantic import BaseModel, ConfigDict, Field

from reservo.core.db.database import Database
from reservo.core.db.reads import read_one
from reservo.core.jobqueue import JobQueue, QueuedJob
from reservo.core.kernel.clock import Clock
from reservo.core.kernel.errors import DomainError
from reservo.core.messaging import inbox
from reservo.core.messaging.transport.base import Event
from reservo.core.messaging.transport.envelope import to_cloudevent
from reservo.scheduler import AllowList, static_refusal
from reservo.webhooks import domain, repo
from reservo.webhooks.domain import Delivery, Endpoint
from reservo.webhooks.sender import Sender

log = structlog.get_logger(__name__)
CONSUMER = "webhooks"
DELIVER = "webhooks.deliver"


class DeliverJob(BaseModel):
    """The payload of a ``webhooks.deliver`` job."""

    model_config = ConfigDict(populate_by_name=True, extra="forbid")

    delivery_id: int = Field(alias="deliveryId", ge=1)
    turn: int = Field(ge=1)
    # Known before the delivery is read: a busy endpoint's job is put back
    # without taking a database connection.
    endpoint_id: int = Field(alias="endpointId", ge=1)


class Webhooks:
    def __init__(
        self,
        db: Database,
        clock: Clock,
        queue: JobQueue,
        sender: Sender,
        allow: AllowList,
        types: Sequence[str],
        source: str,
        retries: domain.Retries,
    ) -> None:
        self.db, self.clock, self.queue, self.sender = db, clock, queue, sender
        self.allow, self.source, self.retries = allow, source, retries
        self.types = sorted(types)
        self._known = set(types)

    # -- endpoints -------------------------------------------------------------

    def _check_types(self, events: Sequence[str]) -> None:
        unknown = domain.unknown_types(events, self._known)
        if unknown:
            raise DomainError(
                "unknown_event_type",
                f"unknown event type(s) {', '.join(unknown)}: see the AsyncAPI document",
            )

    async def create(self, url: str, events: Sequence[str], description: str) -> Endpoint:
        """A new ENABLED endpoint with a fresh secret (shown only here)."""
        why = static_refusal(self.allow, url)
        if why is not None:
            raise DomainError(
                "url_not_allowed",
                f"url is refused: {why} (operators allow destinations with "
                "RESERVO_JOBS_HTTP_ALLOW)",
            )
        self._check_types(events)
        async with self.db.connection() as conn:
            return await repo.insert_endpoint(
                conn, url, sorted(set(events)), description, domain.new_secret(), self.clock.now()
            )

    async def endpoints(self) -> list[Endpoint]:
        async with self.db.connection() as conn:
            return await repo.endpoints(conn)

    async def endpoint(self, endpoint_id: int) -> Endpoint:
        return await read_one(self.db, repo.endpoint, endpoint_id, *_no_endpoint(endpoint_id))

    async def update(
        self,
        endpoint_id: int,
        events: Sequence[str] | None,
        description: str | None,
        status: str | None,
    ) -> Endpoint:
        if events is not None:
            self._check_types(events)
        async with self.db.connection() as conn:
            found = await repo.update_endpoint(
                conn,
                endpoint_id,
                None if events is None else sorted(set(events)),
                description,
                status,
            )
        if found is None:
            raise DomainError(*_no_endpoint(endpoint_id))
        return found

    async def delete(self, endpoint_id: int) -> None:
        """Its pending deliveries are dropped with it (their jobs find nothing)."""
        async with self.db.connection() as conn:
            if not await repo.delete_endpoint(conn, endpoint_id):
                raise DomainError(*_no_endpoint(endpoint_id))

    async def rotate(self, endpoint_id: int) -> str:
        """A new secret; the one it replaces keeps signing for ROTATION_GRACE."""
        secret = domain.new_secret()
        until = self.clock.now() + domain.ROTATION_GRACE
        async with self.db.connection() as conn:
            if not await repo.rotate(conn, endpoint_id, secret, until):
                raise DomainError(*_no_endpoint(endpoint_id))
        return secret

    async def deliveries(self, endpoint_id: int, status: str | None, limit: int) -> list[Delivery]:
        async with self.db.connection() as conn:
            if await repo.endpoint(conn, endpoint_id) is None:
                raise DomainError(*_no_endpoint(endpoint_id))
            return await repo.deliveries(conn, endpoint_id, status, limit)

    async def redeliver(self, delivery_id: int) -> Delivery:
        """A DELIVERED or FAILED delivery is queued again now, with a fresh
        retry window: once, even when asked twice at once (the second request
        finds it PENDING, queued already, and changes nothing)."""
        now = self.clock.now()
        jobs: list[QueuedJob] = []
        async with self.db.transaction() as conn:
            row = await repo.redeliver(conn, delivery_id, now, self.retries.window)
            if row is not None:
                jobs.append(
                    await self._enqueue(conn, row["id"], row["turn"], row["endpoint_id"], now)
                )
            found = await repo.delivery(conn, delivery_id)
        if found is None:
            raise DomainError("webhook_delivery_not_found", f"no delivery {delivery_id}")
        await self._dispatch(jobs)
        return found

    # -- the fan-out (consumer ``webhooks``) -------------------------------------

    async def handle(self, event: Event) -> None:
        await self.handle_many([event])

    async def handle_many(self, events: Sequence[Event]) -> None:
        """One delivery per (subscribed enabled endpoint, event), written with
        the inbox record in the consumer's transaction, each with its first
        job; a redelivered event adds nothing (the inbox, then the unique
        (endpoint, event) key)."""
        jobs: list[QueuedJob] = []

        async def apply(conn: asyncpg.Connection, fresh: list[Event]) -> None:
            now = self.clock.now()
            rows = await repo.fan_out(
                conn,
                [e.id for e in fresh],
                [e.topic for e in fresh],
                [to_cloudevent(e, self.source) for e in fresh],
                [e.created_at for e in fresh],
                now,
                self.retries.window,
            )
            for row in rows:
                jobs.append(
                    await self._enqueue(conn, row["id"], row["turn"], row["endpoint_id"], now)
                )

        await inbox.once_many(self.db, CONSUMER, events, apply)
        await self._dispatch(jobs)

    async def _enqueue(
        self, conn: asyncpg.Connection, delivery_id: int, turn: int, endpoint_id: int, run_at: Any
    ) -> QueuedJob:
        return await self.queue.enqueue(
            DELIVER,
            domain.payload(delivery_id, turn, endpoint_id),
            run_at=run_at,
            idempotency_key=f"{delivery_id}:{turn}",
            conn=conn,
        )

    async def _dispatch(self, jobs: Sequence[QueuedJob]) -> None:
        """After the commit: the jobs due soon go to the runners now (a failure
        loses nothing: the scheduler's loader finds them)."""
        if jobs:
            try:
                await self.queue.dispatch(jobs)
            except Exception as exc:
                log.warning("webhooks_dispatch_deferred", error=repr(exc), jobs=len(jobs))

    # -- one attempt (job ``webhooks.deliver``) ----------------------------------

    async def deliver(self, job: Any) -> None:
        """One attempt of one delivery's turn. Raises JobDeferred (put back, not
        an attempt) when its endpoint has its share of attempts under way."""
        p = DeliverJob.model_validate(job.payload)
        async with self.sender.slot(p.endpoint_id):
            async with self.db.connection() as conn:
                row = await repo.for_attempt(conn, p.delivery_id)
            if row is None or row["status"] != domain.PENDING or row["turn"] != p.turn:
                return  # delivered, given up, dropped with its endpoint, or overtaken
            if row["endpoint_status"] != domain.ENABLED:
                async with self.db.connection() as conn:
                    await repo.given_up(conn, p.delivery_id, p.turn, "endpoint disabled")
                return
            now = self.clock.now()
            body = bytes(row["body"])
            signing = domain.signing_secrets(
                row["secret"], row["previous_secret"], row["previous_until"], now
            )
            headers = domain.headers(str(row["event_id"]), int(now.timestamp()), body, signing)
            outcome = await self.sender.send(row["url"], headers, body)
        await self._record(row, p.turn, outcome)

    async def _record(self, row: asyncpg.Record, turn: int, outcome: domain.Outcome) -> None:
        now = self.clock.now()
        jobs: list[QueuedJob] = []
        async with self.db.transaction() as conn:
            if outcome.ok:
                if await repo.succeeded(conn, row["id"], turn, outcome.status_code, now):
                    await repo.endpoint_succeeded(conn, row["endpoint_id"])
            else:
                next_at = domain.next_attempt(
                    row["attempts"] + 1, now, row["retry_until"], self.retries
                )
                error = (outcome.error or "failed")[: domain.ERROR_TEXT_MAX]
                after = await repo.failed(
                    conn, row["id"], turn, outcome.status_code, error, next_at
                )
                if after is not None and after["status"] == domain.PENDING:
                    jobs.append(
                        await self._enqueue(
                            conn, row["id"], after["turn"], row["endpoint_id"], next_at
                        )
                    )
                status = await repo.endpoint_failed(
                    conn, row["endpoint_id"], now, domain.DISABLE_AFTER
                )
                if status == domain.DISABLED:
                    log.warning("webhooks_endpoint_disabled", endpoint_id=row["endpoint_id"])
        await self._dispatch(jobs)


def _no_endpoint(endpoint_id: int) -> tuple[str, str]:
    return "webhook_endpoint_not_found", f"no webhook endpoint {endpoint_id}"
