"""The only place that runs the wallet module's SQL."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import TypeAlias

import asyncpg

from reservo.core.db.database import Queries

Q = Queries.load("reservo.wallet")

Row: TypeAlias = asyncpg.Record

# The constraint a key written twice violates (write_transfers).
KEY_TAKEN = "idempotency_key_pkey"


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


async def system_account_with_room(
    conn: asyncpg.Connection, kind: str, currency: str, shard: int, delta: int, room: int
) -> int | None:
    return await conn.fetchval(Q.system_account_with_room, kind, currency, shard, delta, room)


async def open_system_account(
    conn: asyncpg.Connection, kind: str, currency: str, now: datetime, delta: int, room: int
) -> None:
    await conn.execute(Q.open_system_account, kind, currency, now, delta, room)


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


async def read_batch(
    conn: asyncpg.Connection,
    ids: Sequence[int],
    count: int,
    endpoint: str,
    keys: Sequence[tuple[str, str]],
) -> Read:
    """The accounts ``ids`` without a lock, ``count`` new transfer ids
    (ascending), and what the (caller, key) ``keys`` of ``endpoint`` hold."""
    accounts: list[Row] = []
    transfer_ids: list[int] = []
    by_key: dict[int, Row] = {}
    rows = await conn.fetch(
        Q.read_batch, list(set(ids)), count, [c for c, _ in keys], [k for _, k in keys], endpoint
    )
    for r in rows:
        if r["what"] == "account":
            accounts.append(r)
        elif r["what"] == "id":
            transfer_ids.append(r["id"])
        else:
            by_key[r["ord"]] = r
    return Read(accounts, sorted(transfer_ids), [by_key[n] for n in range(1, len(keys) + 1)])


@dataclass(frozen=True, slots=True)
class Read:
    """What ``read_batch`` read: account rows, transfer ids, and a row per key
    in the order asked (``idem_known_many``'s columns)."""

    accounts: list[Row]
    transfer_ids: list[int]
    keys: list[Row]


async def lock_balances(conn: asyncpg.Connection, ids: Sequence[int]) -> dict[int, int]:
    """The accounts' balances, locked until the commit."""
    return {r["id"]: r["balance"] for r in await conn.fetch(Q.lock_balances, list(ids))}


async def write_transfers(
    conn: asyncpg.Connection,
    locked: dict[int, int],
    accounts: Sequence[AccountBounds],
    transfers: Sequence[PlannedTransfer],
    now: datetime,
    endpoint: str,
    answers: Sequence[StoredAnswer],
) -> None:
    """On the ``locked`` balances (``lock_balances``): add each account's delta,
    write the ``transfers`` with their entries and store the ``answers``. A key
    of ``answers`` another transaction wrote meanwhile raises
    ``asyncpg.UniqueViolationError`` (constraint ``KEY_TAKEN``): nothing of the
    batch may commit."""
    moved = [a for a in accounts if a.delta]
    await conn.execute(
        Q.write_transfers,
        [a.id for a in moved],
        [locked[a.id] + a.delta for a in moved],
        [t.id for t in transfers],
        [t.source for t in transfers],
        [t.target for t in transfers],
        [t.amount for t in transfers],
        [locked[t.source] + t.source_offset for t in transfers],
        [locked[t.target] + t.target_offset for t in transfers],
        now,
        endpoint,
        [a.caller for a in answers],
        [a.key for a in answers],
        [a.status for a in answers],
        [a.body for a in answers],
        [a.digest for a in answers],
    )


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
    """The response stored for a key (body: serialised JSON): inserted for a
    free key with its request's ``digest``, or completing a claim taken over
    (``digest`` None)."""

    caller: str
    key: str
    status: int
    body: str
    digest: bytes | None


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


async def statement_bounds(
    conn: asyncpg.Connection, fetch_timeout_ms: int, idle_timeout_ms: int
) -> None:
    await conn.execute(Q.statement_bounds, str(fetch_timeout_ms), str(idle_timeout_ms))


def statement_cursor(
    conn: asyncpg.Connection, account_id: int, start: datetime, end: datetime, prefetch: int
) -> asyncpg.cursor.CursorFactory:
    """A server-side cursor over the statement's rows (inside a transaction)."""
    return conn.cursor(Q.statement_csv, account_id, start, end, prefetch=prefetch)
