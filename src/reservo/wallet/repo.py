"""The only place that runs the wallet module's SQL."""

from __future__ import annotations

from collections.abc import Sequence
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


async def apply_transfers(
    conn: asyncpg.Connection,
    sources: list[int],
    targets: list[int],
    amounts: list[int],
    sources_after: list[int],
    targets_after: list[int],
    balances: dict[int, int],
    now: datetime,
) -> list[int]:
    """The transfer ids, in the order given (none written for no transfer)."""
    if not sources:
        return []
    rows = await conn.fetch(
        Q.apply_transfers,
        sources,
        targets,
        amounts,
        sources_after,
        targets_after,
        list(balances),
        list(balances.values()),
        now,
    )
    return [r["id"] for r in rows]


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
