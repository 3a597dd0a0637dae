"""Events the wallet consumes: payout/refund requests (from betting)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import asyncpg

from reservo.core import inbox
from reservo.core.clock import Clock
from reservo.core.db import Database
from reservo.core.transport.base import Event
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


class PayoutConsumer:
    """Applies a chunk of payouts in one transaction. Idempotent twice over: the
    inbox skips a redelivered event, and (kind, reference) is unique, so a bet is
    paid once even if two different events ask for it."""

    def __init__(self, db: Database, clock: Clock, house_shards: int) -> None:
        self.db, self.clock, self.house_shards = db, clock, house_shards

    async def handle(self, event: Event) -> None:
        if event.topic != PAYOUT_REQUESTED:
            return
        items, shard = parse_request(event.payload)

        async def apply(conn: asyncpg.Connection) -> None:
            await pay_many_in_tx(conn, items, shard, self.house_shards, self.clock.now())

        await inbox.once(self.db, CONSUMER, event, apply)
