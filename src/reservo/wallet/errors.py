"""The error codes (with their HTTP status) of the wallet."""

from __future__ import annotations

from reservo.core.kernel.codes import by_status
from reservo.core.kernel.errors import DomainError

ERRORS = by_status(
    not_found=["account_not_found", "transfer_not_found"],
    conflict=[
        "insufficient_funds",
        "currency_mismatch",
        "duplicate_reference",
        "not_pending",
        "pending_expired",
    ],
    unprocessable=["same_account", "balance_out_of_range", "amount_above_pending"],
    unavailable=["statement_busy"],
)

CONSTRAINTS = {
    "wallet_available_non_negative": (
        "insufficient_funds",
        "the account's available money (its balance less its pending transfers) does not cover it",
    ),
    "wallet_account_owner": (
        "validation_error",
        "a customer account needs an owner (>= 1); system accounts have none",
    ),
    "wallet_transfer_reference_once": (
        "duplicate_reference",
        "a transfer of this kind with this reference already exists",
    ),
}


def account_not_found(account_id: int) -> DomainError:
    return DomainError("account_not_found", f"no account {account_id}")


def transfer_not_found(transfer_id: int) -> DomainError:
    return DomainError("transfer_not_found", f"no pending transfer {transfer_id}")
