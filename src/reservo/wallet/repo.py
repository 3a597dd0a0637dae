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


async def get_account(conn: asyncpg.Connection, account_id: int, now: datetime) -> Row | None:
    return await conn.fetchrow(Q.get_account, account_id, now)


async def lock_accounts(
    conn: asyncpg.Connection, ids: Sequence[int], statement_timeout_s: float | None = None
) -> list[Row]:
    return list(await conn.fetch(Q.lock_accounts, list(set(ids)), timeout=statement_timeout_s))


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


@dataclass(frozen=True, slots=True)
class Locked:
    """The balances and pending debits of locked accounts, by id."""

    balances: dict[int, int]
    pending: dict[int, int]


async def lock_balances(conn: asyncpg.Connection, ids: Sequence[int]) -> Locked:
    """The accounts' balances and pending debits, locked until the commit."""
    rows = await conn.fetch(Q.lock_balances, list(ids))
    return Locked(
        {r["id"]: r["balance"] for r in rows}, {r["id"]: r["pending_debits"] for r in rows}
    )


async def release_expired(
    conn: asyncpg.Connection, ids: Sequence[int], now: datetime
) -> dict[int, int]:
    """Void the locked accounts' pending transfers past their expiry at
    ``now``: what each account got back."""
    rows = await conn.fetch(Q.release_expired, list(ids), now)
    return {r["id"]: r["released"] for r in rows}


async def reserve(conn: asyncpg.Connection, account_id: int, amount: int) -> bool:
    return await conn.fetchval(Q.reserve, account_id, amount) is not None


async def insert_pending(
    conn: asyncpg.Connection,
    source: int,
    target: int,
    amount: int,
    expires_at: datetime,
    now: datetime,
) -> Row:
    return await conn.fetchrow(Q.insert_pending, source, target, amount, expires_at, now)


async def get_pending(conn: asyncpg.Connection, transfer_id: int) -> Row | None:
    return await conn.fetchrow(Q.get_pending, transfer_id)


async def resolve_pending(
    conn: asyncpg.Connection,
    transfer_id: int,
    status: str,
    posted: int | None,
    now: datetime,
    expired: bool | None,
) -> Row | None:
    """``expired``: False a post (only before the expiry), True the expiry job
    (only after it), None a void (either)."""
    return await conn.fetchrow(Q.resolve_pending, transfer_id, status, posted, now, expired)


async def post_entries(
    conn: asyncpg.Connection,
    source: int,
    target: int,
    amount: int,
    transfer_id: int,
    created_at: datetime,
    now: datetime,
) -> bool:
    row = await conn.fetchval(Q.post_entries, source, target, amount, transfer_id, created_at, now)
    return row is not None


async def list_pending(
    conn: asyncpg.Connection, account_id: int, now: datetime, after: int | None, limit: int
) -> list[Row]:
    return list(await conn.fetch(Q.list_pending, account_id, now, after, limit))


async def write_transfers(
    conn: asyncpg.Connection,
    locked: Locked,
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
    balances = locked.balances
    await conn.execute(
        Q.write_transfers,
        [a.id for a in moved],
        [balances[a.id] + a.delta for a in moved],
        [t.id for t in transfers],
        [t.source for t in transfers],
        [t.target for t in transfers],
        [t.amount for t in transfers],
        [balances[t.source] + t.source_offset for t in transfers],
        [balances[t.target] + t.target_offset for t in transfers],
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


async def paid_of_references(
    conn: asyncpg.Connection,
    accounts: list[int],
    references: list[str],
    statement_timeout_s: float | None = None,
) -> list[Row]:
    return list(
        await conn.fetch(Q.paid_of_references, accounts, references, timeout=statement_timeout_s)
    )


async def reverse_many(
    conn: asyncpg.Connection,
    house_id: int,
    references: list[str],
    accounts: list[int],
    amounts: list[int],
    now: datetime,
    statement_timeout_s: float | None = None,
) -> Row:
    return await conn.fetchrow(
        Q.reverse_many, house_id, references, accounts, amounts, now, timeout=statement_timeout_s
    )


async def negative_accounts(conn: asyncpg.Connection, after: int, limit: int) -> list[Row]:
    return list(await conn.fetch(Q.negative_accounts, after, limit))


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
