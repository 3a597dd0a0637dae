"""The only place that runs the wallet module's SQL."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import TypeAlias

import asyncpg

from reservo.core.db import Queries

Q = Queries.load("reservo.wallet")

Row: TypeAlias = asyncpg.Record


async def insert_account(
    conn: asyncpg.Connection, owner_id: int, currency: str, now: datetime
) -> Row:
    return await conn.fetchrow(Q.insert_account, owner_id, currency, now)


async def ensure_system_accounts(
    conn: asyncpg.Connection, currency: str, shards: int, now: datetime
) -> None:
    await conn.execute(Q.ensure_system_accounts, currency, shards, now)


async def system_account(
    conn: asyncpg.Connection, kind: str, currency: str, shard: int
) -> int | None:
    return await conn.fetchval(Q.system_account, kind, currency, shard)


async def get_account(conn: asyncpg.Connection, account_id: int) -> Row | None:
    return await conn.fetchrow(Q.get_account, account_id)


async def lock_accounts(conn: asyncpg.Connection, ids: Sequence[int]) -> list[Row]:
    return list(await conn.fetch(Q.lock_accounts, list(set(ids))))


async def apply_transfer(
    conn: asyncpg.Connection,
    source: int,
    target: int,
    amount: int,
    kind: str,
    reference: str | None,
    now: datetime,
) -> Row | None:
    return await conn.fetchrow(Q.apply_transfer, source, target, amount, kind, reference, now)


async def read_accounts(conn: asyncpg.Connection, ids: Sequence[int]) -> list[Row]:
    return list(await conn.fetch(Q.read_accounts, list(set(ids))))


async def transfer_ids(conn: asyncpg.Connection, count: int) -> list[int]:
    return [r["id"] for r in await conn.fetch(Q.transfer_ids, count)] if count else []


@dataclass(frozen=True, slots=True)
class Settled:
    """What ``settle_transfers`` found: whether the plan held (and was written),
    and every account's locked balance before the batch."""

    held: bool
    balances: dict[int, int]


async def settle_transfers(
    conn: asyncpg.Connection,
    accounts: Sequence[AccountBounds],
    transfers: Sequence[PlannedTransfer],
    now: datetime,
    endpoint: str,
    answers: Sequence[StoredAnswer],
) -> Settled:
    """Lock ``accounts`` and, if every balance lies in its bounds, apply the
    deltas, write ``transfers`` and store ``answers`` (queries.sql)."""
    rows = await conn.fetch(
        Q.settle_transfers,
        [a.id for a in accounts],
        [a.lo for a in accounts],
        [a.hi for a in accounts],
        [a.delta for a in accounts],
        [t.id for t in transfers],
        [t.source for t in transfers],
        [t.target for t in transfers],
        [t.amount for t in transfers],
        [t.source_offset for t in transfers],
        [t.target_offset for t in transfers],
        now,
        endpoint,
        [a.caller for a in answers],
        [a.key for a in answers],
        [a.status for a in answers],
        [a.body for a in answers],
    )
    # No account to lock (only refusals that need no balance): the plan holds.
    held = rows[0]["holds"] if rows else not accounts
    return Settled(held, {r["id"]: r["balance"] for r in rows})


@dataclass(frozen=True, slots=True)
class AccountBounds:
    """An account of a planned batch: the range of its balance (lo <= balance <
    hi, None: unbounded) in which every funds check decides as planned, and the
    batch's net change of it."""

    id: int
    lo: int | None
    hi: int | None
    delta: int


@dataclass(frozen=True, slots=True)
class PlannedTransfer:
    """A transfer of a planned batch; the offsets are its accounts' running
    change within the batch right after it (balance_after = balance + offset)."""

    id: int
    source: int
    target: int
    amount: int
    source_offset: int
    target_offset: int


@dataclass(frozen=True, slots=True)
class StoredAnswer:
    """The response stored for a claimed key (body: serialised JSON)."""

    caller: str
    key: str
    status: int
    body: str


async def pay_many(
    conn: asyncpg.Connection,
    house_id: int,
    kinds: list[str],
    references: list[str],
    accounts: list[int],
    amounts: list[int],
    now: datetime,
) -> Row:
    return await conn.fetchrow(Q.pay_many, house_id, kinds, references, accounts, amounts, now)


async def statement(
    conn: asyncpg.Connection, account_id: int, before: int | None, limit: int
) -> list[Row]:
    return list(await conn.fetch(Q.statement, account_id, before, limit))


async def currencies(conn: asyncpg.Connection, ids: list[int]) -> list[Row]:
    return list(await conn.fetch(Q.currencies, ids))
