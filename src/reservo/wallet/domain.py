"""Pure wallet rules (no I/O)."""

from __future__ import annotations

from dataclasses import dataclass

KINDS = ("DEPOSIT", "TRANSFER", "STAKE", "PAYOUT", "REFUND")


@dataclass(frozen=True)
class AccountRef:
    id: int
    owner_id: int
    currency: str
    kind: str


class TransferRefused(Exception):
    def __init__(self, code: str, detail: str) -> None:
        super().__init__(detail)
        self.code, self.detail = code, detail


def check_transfer(source: AccountRef, target: AccountRef, amount: int) -> None:
    """Rules a transfer must pass before it touches a balance."""
    if amount <= 0:
        raise TransferRefused("validation_error", "amount must be positive")
    if source.id == target.id:
        raise TransferRefused("same_account", "cannot transfer to the same account")
    if source.currency != target.currency:
        raise TransferRefused(
            "currency_mismatch",
            f"account {source.id} holds {source.currency}, account {target.id} {target.currency}",
        )


def house_shard(account_id: int, shards: int) -> int:
    """Which house sub-account takes a customer's stakes: spreads the hot row."""
    return account_id % max(1, shards)


def bet_reference(bet_id: int) -> str:
    return f"bet:{bet_id}"
