"""Events the wallet consumes: payout/refund requests (from betting)."""

from __future__ import annotations

import uuid
from collections.abc import Sequence
from datetime import datetime
from typing import Any

import asyncpg

from reservo.core.db.database import Database
from reservo.core.kernel.clock import Clock
from reservo.core.kernel.contract import EventSpec
from reservo.core.messaging import deadletters, inbox
from reservo.core.messaging.failures import Rejected, is_transient
from reservo.core.messaging.transport.base import Event
from reservo.wallet import domain
from reservo.wallet.service import Payout, pay_many_in_tx

# An account's credits, in order: every payout event of one account carries the
# key of its bucket (see ``bucket``).
STREAM = "wallet.account.v1"
PAYOUT_REQUESTED = "wallet.account.payouts-requested.v1"
TOPICS = (PAYOUT_REQUESTED,)
CONSUMER = "wallet.payouts"


def bucket(account_id: int, house_shards: int) -> int:
    """The bucket of an account: a payout event holds the credits of one bucket,
    keyed by it, so every payout of one account carries the same key (one
    partition, in order) whatever match or chunk it comes from. The bucket is
    also the house sub-account that pays it (the one that took the stakes): two
    events of one key never run at once, so neither do two on one house row."""
    return domain.house_shard(account_id, house_shards)


def payouts_key(bucket: int) -> str:
    return f"accounts:{bucket}"


def by_bucket(items: Sequence[Payout], house_shards: int) -> dict[int, list[Payout]]:
    """A chunk's credits split by bucket (in their order within each)."""
    out: dict[int, list[Payout]] = {}
    for p in items:
        out.setdefault(bucket(p.account_id, house_shards), []).append(p)
    return dict(sorted(out.items()))


def payout_request(items: Sequence[Payout], shard: int) -> dict[str, Any]:
    """The payload of ``PAYOUT_REQUESTED``: credits of one account bucket."""
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


# -- the contract (core/kernel/contract.py): what a subscriber may rely on ---------------

CONTRACT = (
    EventSpec(
        name=PAYOUT_REQUESTED,
        stream=STREAM,
        summary="Credits to pay (bet payouts and refunds), all of one account bucket; "
        "each (kind, reference, account) is paid once.",
        key="accounts:{shard}",
        key_doc="the bucket of the credited accounts (accountId mod "
        "RESERVO_WALLET_HOUSE_SHARDS): every payout of one account carries the same "
        "key, so an account's credits stay in order",
        schema={
            "type": "object",
            "required": ["shard", "items"],
            "properties": {
                "shard": {
                    "type": "integer",
                    "minimum": 0,
                    "description": "The bucket: every item's accountId mod the shard count.",
                },
                "items": {
                    "type": "array",
                    "minItems": 1,
                    "items": {
                        "type": "object",
                        "required": ["kind", "reference", "accountId", "amount"],
                        "properties": {
                            "kind": {"enum": ["PAYOUT", "REFUND"]},
                            "reference": {"type": "string"},
                            "accountId": {"type": "integer", "minimum": 1},
                            "amount": {
                                "type": "integer",
                                "minimum": 1,
                                "description": "Minor units.",
                            },
                        },
                    },
                },
            },
            "additionalProperties": True,
        },
        example={
            "shard": 5,
            "items": [{"kind": "PAYOUT", "reference": "bet:501", "accountId": 77, "amount": 2500}],
        },
        formerly=("wallet.payout.requested.v1",),
    ),
)
