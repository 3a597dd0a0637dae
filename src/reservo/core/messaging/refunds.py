"""Executing the refunds a module requested through its outbox, once per event,
outside any transaction: the module's REFUND row takes 'refund:<event id>' as
its provider_txn_id (UNIQUE) and the gateway gets the event id as its
idempotency key, so a redelivered event refunds once.

Knows no module: each one (rentals, appointments) names its topic, the payload
field of what was paid for, and its own ledger queries (its SQL, its table)."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from datetime import datetime
from typing import Any, Protocol

import asyncpg

from reservo.core.db.database import Database
from reservo.core.kernel.clock import Clock
from reservo.core.kernel.errors import DomainError
from reservo.core.messaging.transport.base import Event


class RefundGateway(Protocol):
    async def refund(self, target_id: int, amount: int, reference: str, subject: str, /) -> str:
        """Refund ``amount`` for ``target_id`` (named by ``subject``); ``reference``
        is the idempotency key. Returns the gateway's reference."""
        ...


@dataclass(frozen=True, slots=True)
class RefundLedger:
    """One module's side of its refunds."""

    topic: str  # the refund-requested event this module emits
    subject: str  # the payload field naming what was paid for, and the gateway's subject
    log_prefix: str  # "<prefix>_refunded", "<prefix>_refund_waiting"
    log_field: str  # what the id is called in those log lines
    no_gateway: str  # the error detail while no gateway is configured
    recorded: Callable[[asyncpg.Connection, str], Awaitable[bool]]
    record: Callable[[asyncpg.Connection, int, str, int, str, datetime], Awaitable[bool]]


class RefundConsumer:
    def __init__(
        self,
        db: Database,
        gateway: RefundGateway | None,
        clock: Clock,
        ledger: RefundLedger,
        log: Any,
    ) -> None:
        self.db, self.gateway, self.clock = db, gateway, clock
        # The module's logger: its refund lines keep the module's logger name.
        self.ledger, self.log = ledger, log

    async def handle(self, event: Event) -> None:
        ledger = self.ledger
        if event.topic != ledger.topic:
            return
        p = event.payload
        txn = f"refund:{event.id}"
        async with self.db.connection() as conn:
            if await ledger.recorded(conn, txn):
                return
        if self.gateway is None:
            # Failing (not returning) keeps the event: the relay retries it with
            # backoff, and a Kafka consumer defers it (a 5xx DomainError is never
            # parked), until a restart with a gateway executes it.
            self.log.error(
                f"{ledger.log_prefix}_refund_waiting",
                event_id=str(event.id),
                **{ledger.log_field: p[ledger.subject]},
                error=ledger.no_gateway,
            )
            raise DomainError("payment_gateway_unconfigured", ledger.no_gateway)
        target_id, amount = int(p[ledger.subject]), int(p["amount"])
        ref = await self.gateway.refund(target_id, amount, str(event.id), ledger.subject)
        async with self.db.transaction() as conn:
            await ledger.record(conn, target_id, txn, amount, ref, self.clock.now())
        self.log.info(
            f"{ledger.log_prefix}_refunded", **{ledger.log_field: target_id}, amount=amount, ref=ref
        )
