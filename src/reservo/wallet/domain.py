"""Pure wallet rules (no I/O)."""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import UTC, date, datetime, time, timedelta
from typing import Any

from reservo.core.db.rows import FromRow
from reservo.core.http.auth import Principal

KINDS = ("DEPOSIT", "TRANSFER", "STAKE", "PAYOUT", "REFUND", "REVERSAL")

# A balance is a PostgreSQL bigint: no account can hold more.
BALANCE_MAX = 2**63 - 1
# A system sub-account (WORLD, HOUSE) takes a movement only while its balance
# stays within +-SYSTEM_ROOM after it; past that the movement goes to another
# sub-account of the same kind and currency, a new one when none has room. So a
# system account's range never stops a deposit, a stake or a payout, and the
# half range left is headroom for movements other transactions have in flight
# (one is at most 10^15; it would take thousands at once on one row to matter).
SYSTEM_ROOM = 2**62


@dataclass(frozen=True)
class AccountRef(FromRow):
    id: int
    owner_id: int | None  # None for the system accounts (WORLD, HOUSE): nobody's
    currency: str
    kind: str


@dataclass(frozen=True, slots=True)
class Account(FromRow):
    id: int
    owner_id: int | None  # None for the system accounts (WORLD, HOUSE): nobody's
    currency: str
    kind: str  # CUSTOMER | WORLD | HOUSE
    balance: int  # posted
    available: int  # the balance less the pending transfers out not past their expiry


@dataclass(frozen=True, slots=True)
class Transfer(FromRow):
    id: int
    kind: str
    reference: str | None
    from_account_id: int
    to_account_id: int
    amount: int
    created_at: datetime
    status: str = "POSTED"  # PENDING | POSTED | VOIDED (only a two-phase one is ever not POSTED)
    expires_at: datetime | None = None  # a two-phase transfer's

    @classmethod
    def pending(cls, row: Mapping[str, Any]) -> Transfer:
        """A two-phase transfer from its wallet_pending_transfer row: a posted
        one shows the amount it posted."""
        return cls(
            row["id"],
            "TRANSFER",
            None,
            row["from_account_id"],
            row["to_account_id"],
            row["posted_amount"] or row["amount"],
            row["created_at"],
            row["status"],
            row["expires_at"],
        )


@dataclass(frozen=True, slots=True)
class Entry(FromRow):
    """One line of an account's ledger: its side of a transfer."""

    id: int
    transfer_id: int
    amount: int  # negative: a debit
    balance_after: int
    kind: str
    reference: str | None
    created_at: datetime


def may_act_for(caller: Principal, owner: int | None) -> bool:
    """A bettor acts for its own accounts, an admin for any. A system account
    (WORLD, HOUSE) has no owner: no sub, whatever its value, acts for it; only an
    admin may read it (and nobody may move it, see ROUTES). The caller answers
    anyone else's account as one that does not exist (404): a 403 would tell
    which ids exist."""
    return caller.is_admin or (owner is not None and caller.owns("bettor", owner))


class TransferRefused(Exception):
    def __init__(self, code: str, detail: str) -> None:
        super().__init__(detail)
        self.code, self.detail = code, detail


# Which accounts each kind of movement may debit and credit. Money enters only by
# a DEPOSIT (from WORLD); the house takes stakes and pays payouts and refunds; a
# TRANSFER (the public endpoint, whoever calls it, admin included) moves money
# between customers only, so it can neither mint money out of WORLD nor drain or
# feed a HOUSE account.
ROUTES: dict[str, tuple[str, str]] = {
    "DEPOSIT": ("WORLD", "CUSTOMER"),
    "TRANSFER": ("CUSTOMER", "CUSTOMER"),
    "STAKE": ("CUSTOMER", "HOUSE"),
    "PAYOUT": ("HOUSE", "CUSTOMER"),
    "REFUND": ("HOUSE", "CUSTOMER"),
    # A payout or refund taken back when its bet is resettled: the only debit
    # that may take a customer below zero (pay_many's reverse, reverse_many).
    "REVERSAL": ("CUSTOMER", "HOUSE"),
}


def check_transfer(kind: str, source: AccountRef, target: AccountRef, amount: int) -> None:
    """Rules a movement of ``kind`` must pass before it touches a balance.

    Details never describe the other account (its currency, its balance): the
    target is often somebody else's."""
    if amount <= 0:
        raise TransferRefused("validation_error", "amount must be positive")
    if source.id == target.id:
        raise TransferRefused("same_account", "cannot transfer to the same account")
    if (source.kind, target.kind) != ROUTES.get(kind):
        if kind == "TRANSFER":
            raise TransferRefused("forbidden", "system accounts cannot be moved through transfers")
        raise TransferRefused(
            "forbidden", f"a {kind} cannot move money from a {source.kind} to a {target.kind}"
        )
    if source.currency != target.currency:
        raise TransferRefused("currency_mismatch", "the two accounts hold different currencies")


def check_credit(account_id: int, balance: int, amount: int) -> None:
    """A customer's balance plus ``amount`` must stay a balance: refused (422)
    for this movement only, before it touches anything."""
    if balance > BALANCE_MAX - amount:
        raise credit_refused(account_id, amount)


def credit_refused(account_id: int, amount: int) -> TransferRefused:
    return TransferRefused(
        "balance_out_of_range", f"account {account_id} cannot hold {amount} more"
    )


# A pending transfer's timeout (timeoutS): a second to a week.
PENDING_TIMEOUT_MAX_S = 7 * 24 * 3600


def house_shard(account_id: int, shards: int) -> int:
    """Which house sub-account takes a customer's stakes: spreads the hot row."""
    return account_id % max(1, shards)


def bet_reference(bet_id: int, generation: int = 1) -> str:
    """The wallet reference of a bet's payout (or refund) in its settlement
    ``generation``: each generation is paid once (the reference is unique per
    account and kind). Generation 1 keeps the reference payouts always had."""
    return f"bet:{bet_id}" if generation == 1 else f"bet:{bet_id}:g{generation}"


# -- the CSV statement's date range --------------------------------------------

# At most a year (a leap one) per download, and the years the API accepts.
STATEMENT_MAX_DAYS = 366
FIRST_DAY, END_DAY = date(2000, 1, 1), date(2100, 1, 1)
_DAY = re.compile(r"[0-9]{4}-[0-9]{2}-[0-9]{2}", re.ASCII)


class BadRange(ValueError):
    """A date range the statement refuses; ``field`` is the query parameter."""

    def __init__(self, field: str, msg: str) -> None:
        super().__init__(msg)
        self.field = field


def parse_day(field: str, raw: str) -> date:
    """A YYYY-MM-DD day in [2000-01-01, 2100-01-01), nothing else."""
    if not _DAY.fullmatch(raw):
        raise BadRange(field, "a date is YYYY-MM-DD")
    try:
        day = date.fromisoformat(raw)
    except ValueError:
        raise BadRange(field, "no such date") from None
    if not FIRST_DAY <= day < END_DAY:
        raise BadRange(field, "a date is in [2000-01-01, 2100-01-01)")
    return day


def statement_window(raw_from: str, raw_to: str) -> tuple[datetime, datetime]:
    """[from 00:00 UTC, the day after `to` 00:00 UTC): whole UTC days, `to`
    included, at most STATEMENT_MAX_DAYS of them."""
    start, end = parse_day("from", raw_from), parse_day("to", raw_to)
    if end < start:
        raise BadRange("to", "`to` is before `from`")
    if (end - start).days + 1 > STATEMENT_MAX_DAYS:
        raise BadRange("to", f"at most {STATEMENT_MAX_DAYS} days per statement")
    midnight = time(tzinfo=UTC)
    return datetime.combine(start, midnight), datetime.combine(end, midnight) + timedelta(days=1)
