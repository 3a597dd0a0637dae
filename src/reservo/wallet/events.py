"""Events the wallet consumes: payout/refund requests (from betting)."""

from __future__ import annotations

import uuid
from collections.abc import Sequence
from datetime import datetime
from typing import Any

import asyncpg

from reservo.core import deadletters, inbox
from reservo.core.clock import Clock
from reservo.core.db import Database
from reservo.core.failures import Rejected, is_transient
from reservo.core.transport.base import Event
from reservo.wallet import domain
from reservo.wallet.service import Payout, pay_many_in_tx

PAYOUT_REQUESTED = "wallet.payout.requested.v1"
TOPICS = (PAYOUT_REQUESTED,)
CONSUMER = "wallet.payouts"


def payout_request(items: Sequence[Payout], shard: int) -> dict[str, Any]:
    """The payload of ``wallet.payout.requested.v1``: a chunk of credits."""
    return {
        "shard": shard,
        "items": [
            {
                "kind": p.kind,
                "reference": p.reference,
                "accountId": p.account_id,
                "amount": p.amount,
            }
            for p in items
        ],
    }


def parse_request(payload: dict[str, Any]) -> tuple[list[Payout], int]:
    items = [
        Payout(str(i["kind"]), str(i["reference"]), int(i["accountId"]), int(i["amount"]))
        for i in payload["items"]
    ]
    return items, int(payload.get("shard", 0))


def item_event(event: Event, item: Payout, shard: int, now: datetime) -> Event:
    """One item of a payout event as an event of its own, to park it alone. Its
    id follows from the event's and the item's reference: parking the same item
    of the same event again (a replay of the whole event) is the same letter."""
    return Event(
        uuid.uuid5(event.id, f"{item.kind}:{item.reference}"),
        event.topic,
        event.key,
        payout_request([item], shard),
        now,
    )


class PayoutConsumer:
    """Applies a chunk of payouts in one transaction. Idempotent twice over: the
    inbox skips a redelivered event, and a (credited account, kind, reference)
    is unique, so a bet is paid once even if two different events ask for it.

    One item that cannot be paid (its account unknown, or full to its range)
    blocks none of the others: the chunk is paid item by item, the items that
    fail are parked as events of their own (one dead letter each, replayable
    once the cause is fixed), and the rest commits with them and the inbox
    record. An event none of whose items can be paid is refused whole (for a
    one-item event, that is its own dead letter staying parked)."""

    def __init__(self, db: Database, clock: Clock, house_shards: int) -> None:
        self.db, self.clock, self.house_shards = db, clock, house_shards

    async def handle(self, event: Event) -> None:
        if event.topic != PAYOUT_REQUESTED:
            return
        items, shard = parse_request(event.payload)
        now = self.clock.now()

        async def apply(conn: asyncpg.Connection) -> None:
            failed = await self._pay(conn, items, shard, now)
            if failed and len(failed) == len(items):
                raise failed[0][1]
            for item, exc in failed:
                parked = item_event(event, item, shard, now)
                await deadletters.park_in_tx(conn, CONSUMER, parked, exc, now)

        await inbox.once(self.db, CONSUMER, event, apply)

    async def _pay(
        self, conn: asyncpg.Connection, items: Sequence[Payout], shard: int, now: datetime
    ) -> list[tuple[Payout, Exception]]:
        """The chunk in one statement (the common case); when that fails for the
        data of an item, each item alone, each in a savepoint. Returns the items
        that failed alone with their errors. A transient failure propagates:
        nothing is parked for an outage."""
        try:
            async with conn.transaction():
                await pay_many_in_tx(conn, items, shard, self.house_shards, now)
            return []
        except Exception as exc:
            if is_transient(exc):
                raise
        failed: list[tuple[Payout, Exception]] = []
        for item in items:
            try:
                async with conn.transaction():
                    await pay_many_in_tx(conn, [item], shard, self.house_shards, now)
            except Exception as exc:
                if is_transient(exc):
                    raise
                failed.append((item, _readable(item, exc)))
        return failed


def _readable(item: Payout, exc: Exception) -> Exception:
    """The dead letter's error: an item overflowing its account says so."""
    if isinstance(exc, asyncpg.NumericValueOutOfRangeError):
        refused = domain.credit_refused(item.account_id, item.amount)
        return Rejected(f"{refused.code}: {refused.detail}")
    return exc
