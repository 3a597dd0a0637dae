"""Wallet: accounts, transfers and a double-entry ledger. Never double-spends.

This is the public facade other modules use (betting debits stakes and requests
payouts through it); they never import the wallet's internals."""

from reservo.wallet.domain import Account, bet_reference, house_shard
from reservo.wallet.events import PAYOUT_REQUESTED, payout_request
from reservo.wallet.service import Payout, get_account_in_tx, house_account_in_tx, transfer_in_tx

__all__ = [
    "PAYOUT_REQUESTED",
    "Account",
    "Payout",
    "bet_reference",
    "get_account_in_tx",
    "house_account_in_tx",
    "house_shard",
    "payout_request",
    "transfer_in_tx",
]
