"""Wallet: accounts, transfers and a double-entry ledger. Never double-spends.

This is the public facade other modules use (betting debits stakes and credits
payouts through it); they never import the wallet's internals."""

from reservo.wallet.domain import Account, bet_reference, house_shard
from reservo.wallet.events import PAYOUT_REQUESTED, by_bucket, payout_request, payouts_key
from reservo.wallet.service import (
    Payout,
    get_account_in_tx,
    house_account_in_tx,
    pay_many_in_tx,
    reverse_paid_in_tx,
    transfer_in_tx,
)

__all__ = [
    "PAYOUT_REQUESTED",
    "Account",
    "Payout",
    "bet_reference",
    "by_bucket",
    "get_account_in_tx",
    "house_account_in_tx",
    "house_shard",
    "pay_many_in_tx",
    "payout_request",
    "payouts_key",
    "reverse_paid_in_tx",
    "transfer_in_tx",
]
