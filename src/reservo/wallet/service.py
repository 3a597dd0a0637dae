"""Wallet use cases. Each owns its transaction: lock, check, write.

``transfer_in_tx`` and ``pay_many_in_tx`` run inside a caller's transaction, so the
betting module can debit a stake atomically with the bet it inserts."""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import UTC, datetime

import asyncpg

from reservo.core.db.database import Database
from reservo.core.http.idempotency import Within
from reservo.core.kernel.clock import Clock
from reservo.core.kernel.currencies import Currencies
from reservo.core.kernel.errors import DomainError, validation_error
from reservo.wallet import domain, repo
from reservo.wallet.domain import Account, Entry, Transfer
from reservo.wallet.errors import account_not_found


@dataclass(frozen=True)
class Payout:
    """One credit from the house: a bet's payout or its refunded stake."""

    kind: str  # PAYOUT | REFUND
    reference: str
    account_id: int
    amount: int


async def transfer_in_tx(
    conn: asyncpg.Connection,
    source_id: int,
    target_id: int,
    amount: int,
    kind: str,
    reference: str | None,
    now: datetime,
) -> Transfer:
    """Move money inside the caller's transaction: lock both rows in ascending id
    order, check, update both, write the transfer and its two entries."""
    rows = {r["id"]: r for r in await repo.lock_accounts(conn, [source_id, target_id])}
    for account_id in (source_id, target_id):
        if account_id not in rows:
            raise account_not_found(account_id)
    try:
        domain.check_transfer(
            kind,
            domain.AccountRef.from_row(rows[source_id]),
            domain.AccountRef.from_row(rows[target_id]),
            amount,
        )
        domain.check_credit(target_id, rows[target_id]["balance"], amount)
    except domain.TransferRefused as exc:
        raise DomainError(exc.code, exc.detail) from None
    row = await repo.apply_transfer(conn, source_id, target_id, amount, kind, reference, now)
    # An expired pending transfer reserves nothing: void the source's expired
    # ones (it is locked) and try once more.
    if (
        row is None
        and rows[source_id]["pending_debits"]
        and await repo.release_expired(conn, [source_id], now)
    ):
        row = await repo.apply_transfer(conn, source_id, target_id, amount, kind, reference, now)
    if row is None:
        # Names only the source, the caller's own account (the target may be anybody's).
        currency = rows[source_id]["currency"]
        raise DomainError(
            "insufficient_funds", f"account {source_id} does not hold {amount} {currency}"
        )
    return Transfer.from_row(row)


async def get_account_in_tx(
    conn: asyncpg.Connection, account_id: int, now: datetime | None = None
) -> Account | None:
    """An account, or None. owner_id is None for the system accounts (WORLD, HOUSE).
    Its ``available`` is as of ``now`` (the system clock when not given)."""
    row = await repo.get_account(conn, account_id, now or datetime.now(UTC))
    return None if row is None else Account.from_row(row)


async def house_account_in_tx(
    conn: asyncpg.Connection,
    currency: str,
    shard: int,
    shards: int,
    now: datetime,
    delta: int = 0,
) -> int:
    """The house sub-account a movement changing the house by ``delta`` uses:
    ``shard`` while it has room for it, else another (see system_account_in_tx)."""
    return await system_account_in_tx(conn, "HOUSE", currency, shard, shards, now, delta)


async def system_account_in_tx(
    conn: asyncpg.Connection,
    kind: str,
    currency: str,
    shard: int,
    shards: int,
    now: datetime,
    delta: int,
) -> int:
    """The sub-account of ``kind`` (WORLD, HOUSE) and ``currency`` that a
    movement changing it by ``delta`` uses: the preferred ``shard`` while its
    balance stays within +-SYSTEM_ROOM after it, else the lowest shard that
    does, else a new sub-account. The operator's position is the sum over the
    sub-accounts, so which one takes the movement changes nothing else; and a
    system account full to its range never stops a deposit, stake or payout."""
    for _ in range(3):  # created, or created by a concurrent opener: found next time
        found = await repo.system_account_with_room(
            conn, kind, currency, shard, delta, domain.SYSTEM_ROOM
        )
        if found is not None:
            return found
        if await repo.system_account(conn, kind, currency, 0) is None:
            await repo.ensure_system_accounts(conn, currency, shards, now)
        else:
            await repo.open_system_account(conn, kind, currency, now, delta, domain.SYSTEM_ROOM)
    raise DomainError("unavailable", f"no {kind} sub-account of {currency} has room; retry")


async def pay_many_in_tx(
    conn: asyncpg.Connection, items: Sequence[Payout], shard: int, shards: int, now: datetime
) -> int:
    """Credit a chunk of payouts/refunds from the house in the caller's
    transaction. The house sub-account row is updated once per currency, not once
    per payout. A reference already paid is skipped. Returns how many were applied."""
    if not items:
        return 0
    ids = sorted({p.account_id for p in items})
    currencies = await _currencies(conn, ids)
    by_currency: dict[str, list[Payout]] = defaultdict(list)
    for p in items:
        if p.account_id not in currencies:
            raise account_not_found(p.account_id)
        by_currency[currencies[p.account_id]].append(p)
    houses = {
        cur: await house_account_in_tx(
            conn, cur, shard % max(1, shards), shards, now, -sum(p.amount for p in group)
        )
        for cur, group in by_currency.items()
    }
    # One lock statement, ascending ids, house rows included: same order as transfers.
    await repo.lock_accounts(conn, [*ids, *houses.values()])
    applied = 0
    for cur, group in by_currency.items():
        row = await repo.pay_many(
            conn,
            houses[cur],
            [p.kind for p in group],
            [p.reference for p in group],
            [p.account_id for p in group],
            [p.amount for p in group],
            now,
        )
        applied += int(row["applied"])
    return applied


async def reverse_paid_in_tx(
    conn: asyncpg.Connection,
    paid: Sequence[tuple[int, str]],
    shard: int,
    shards: int,
    now: datetime,
    statement_timeout_s: float | None = None,
) -> int:
    """Take back, in the caller's transaction, the payouts and refunds paid under
    these (account, reference) pairs: a REVERSAL each, into a house sub-account,
    even when it takes the account below zero (the payout was spent). A pair
    never paid (a payout still deferred, or nothing won) reverses nothing.
    Returns the total reversed. ``statement_timeout_s``: per statement, for a match of
    hundreds of thousands of bets (the pool's command timeout otherwise)."""
    if not paid:
        return 0
    rows = await repo.paid_of_references(
        conn, [a for a, _ in paid], [r for _, r in paid], statement_timeout_s
    )
    if not rows:
        return 0
    ids = sorted({r["account_id"] for r in rows})
    currencies = await _currencies(conn, ids)
    by_currency: dict[str, list[asyncpg.Record]] = defaultdict(list)
    for r in rows:
        by_currency[currencies[r["account_id"]]].append(r)
    houses = {
        cur: await house_account_in_tx(
            conn, cur, shard % max(1, shards), shards, now, sum(r["amount"] for r in group)
        )
        for cur, group in by_currency.items()
    }
    await repo.lock_accounts(conn, [*ids, *houses.values()], statement_timeout_s)
    total = 0
    for cur, group in by_currency.items():
        row = await repo.reverse_many(
            conn,
            houses[cur],
            [r["reference"] for r in group],
            [r["account_id"] for r in group],
            [r["amount"] for r in group],
            now,
            statement_timeout_s,
        )
        total += int(row["total"])
    return total


async def _currencies(conn: asyncpg.Connection, ids: list[int]) -> dict[int, str]:
    return {r["id"]: r["currency"] for r in await repo.currencies(conn, ids)}


class WalletService:
    def __init__(
        self,
        db: Database,
        clock: Clock,
        house_shards: int = 8,
        currencies: Currencies | None = None,
    ) -> None:
        self.db, self.clock, self.house_shards = db, clock, house_shards
        self.currencies = currencies or Currencies()

    async def create_account(self, owner_id: int, currency: str) -> Account:
        """An account of ``owner_id`` in ``currency``: an ISO 4217 code or one
        the operator added (422 validation_error otherwise, nothing stored)."""
        refused = self.currencies.refusal(currency)
        if refused is not None:
            raise validation_error(
                refused, [{"loc": ["body", "currency"], "msg": refused, "type": "value_error"}]
            )
        now = self.clock.now()
        async with self.db.transaction() as conn:
            await repo.ensure_system_accounts(conn, currency, self.house_shards, now)
            return Account.from_row(await repo.insert_account(conn, owner_id, currency, now))

    async def get_account(self, account_id: int) -> Account:
        async with self.db.connection() as conn:
            row = await repo.get_account(conn, account_id, self.clock.now())
        if row is None:
            raise account_not_found(account_id)
        return Account.from_row(row)

    async def deposit(
        self, account_id: int, amount: int, reference: str, within: Within[Transfer] | None = None
    ) -> Transfer:
        """Money enters from the currency's world account."""
        now = self.clock.now()
        async with self.db.transaction() as conn:
            account = await repo.get_account(conn, account_id, now)
            if account is None or account["kind"] != "CUSTOMER":
                raise account_not_found(account_id)
            world = await system_account_in_tx(
                conn, "WORLD", account["currency"], 0, self.house_shards, now, -amount
            )
            transfer = await transfer_in_tx(
                conn, world, account_id, amount, "DEPOSIT", reference, now
            )
            if within is not None:
                await within(conn, transfer)
        return transfer

    async def pay_many(self, items: Sequence[Payout], shard: int = 0) -> int:
        async with self.db.transaction() as conn:
            return await pay_many_in_tx(conn, items, shard, self.house_shards, self.clock.now())

    async def negative_accounts(self, after: int | None, limit: int) -> list[Account]:
        """Customer accounts below zero (a resettlement reversed a payout they had
        spent), by id: they can neither bet nor transfer out until back at zero."""
        async with self.db.connection() as conn:
            rows = await repo.negative_accounts(conn, after or 0, limit)
        return [Account.from_row(r) for r in rows]

    async def statement(
        self, account_id: int, before: int | None, limit: int
    ) -> tuple[Account, list[Entry], int | None]:
        """Newest first; one row more than asked tells whether another page exists.
        Balance and page come from one snapshot (REPEATABLE READ)."""
        async with self.db.connection() as conn, conn.transaction(isolation="repeatable_read"):
            account = await repo.get_account(conn, account_id, self.clock.now())
            if account is None:
                raise account_not_found(account_id)
            rows = await repo.statement(conn, account_id, before, limit + 1)
        entries = [Entry.from_row(r) for r in rows[:limit]]
        next_before = entries[-1].id if len(rows) > limit else None
        return Account.from_row(account), entries, next_before
