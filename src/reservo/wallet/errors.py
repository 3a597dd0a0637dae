"""The error codes (with their HTTP status) of the wallet."""

from __future__ import annotations

ERRORS = {
    "account_not_found": 404,
    "insufficient_funds": 409,
    "currency_mismatch": 409,
    "same_account": 422,
    "duplicate_reference": 409,
}

CONSTRAINTS = {
    "wallet_balance_non_negative": (
        "insufficient_funds",
        "the account does not hold enough money",
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
