"""Builds the wallet module from settings and the shared parts."""

from __future__ import annotations

from dataclasses import dataclass

from reservo.core.kernel.currencies import Currencies, parse_extra
from reservo.core.module import Consumes, JobKind, Module
from reservo.shared import Shared
from reservo.wallet import events
from reservo.wallet.api import HOT_ROUTES, render_transfer, router
from reservo.wallet.batch import TransferBatch
from reservo.wallet.errors import CONSTRAINTS, ERRORS
from reservo.wallet.events import PayoutConsumer
from reservo.wallet.export import StatementExport
from reservo.wallet.pending import EXPIRE_PENDING, ExpirePendingJob, PendingTransfers
from reservo.wallet.service import WalletService


@dataclass(frozen=True, kw_only=True)
class Wallet(Module):
    service: WalletService
    payouts: PayoutConsumer
    transfers: TransferBatch
    export: StatementExport
    pending: PendingTransfers


def setup(shared: Shared) -> Wallet:
    own = shared.settings.wallet
    shards = own.house_shards
    service = WalletService(
        shared.db, shared.clock, shards, Currencies(parse_extra(own.currencies))
    )
    payouts = PayoutConsumer(shared.db, shared.clock, shards)
    transfers = TransferBatch(shared.db, shared.clock, shared.idempotency, render_transfer)
    export = StatementExport(shared.db, own)
    # One expiry job per pending transfer (an internal category: only the wallet makes them).
    pending = PendingTransfers(shared.db, shared.clock, shared.scheduler)
    return Wallet(
        name="wallet",
        service=service,
        payouts=payouts,
        transfers=transfers,
        export=export,
        pending=pending,
        routers=[router],
        hot=HOT_ROUTES,
        consumes=[Consumes(events.CONSUMER, [events.PAYOUT_REQUESTED], payouts.handle)],
        jobs=[JobKind(EXPIRE_PENDING, pending.expire_job, payload=ExpirePendingJob)],
        events=events.CONTRACT,
        errors=ERRORS,
        constraints=CONSTRAINTS,
        state={
            "wallet": service,
            "wallet_transfers": transfers,
            "wallet_export": export,
            "wallet_pending": pending,
        },
        closers=[transfers.close],
    )
