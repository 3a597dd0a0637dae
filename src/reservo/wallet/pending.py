"""Two-phase transfers: a pending transfer reserves its amount on its source
(``pending_debits``), then is posted (whole or part: the entries are written
then, the rest released), voided, or voided by its expiry job at ``expiresAt``.

Every step locks the accounts first (ascending ids, as every other movement),
then moves the pending row out of PENDING by one conditional UPDATE
(``resolve_pending``): whoever races (a post, a void, the expiry job), one
transition wins and the others see it is no longer PENDING. A pending
transfer past its expiry reserves nothing even before its job runs: the
account's ``available`` leaves it out and a debit refused for funds voids the
source's expired ones first (``repo.release_expired``)."""

from __future__ import annotations

from datetime import datetime, timedelta
from typing import Any

import asyncpg
import structlog

from reservo.core.db.database import Database
from reservo.core.http.auth import Principal
from reservo.core.http.idempotency import Within
from reservo.core.http.schemas import ApiModel, Id
from reservo.core.jobqueue import JobQueue, QueuedJob
from reservo.core.kernel.clock import Clock
from reservo.core.kernel.errors import DomainError
from reservo.wallet import domain, repo
from reservo.wallet.domain import Transfer
from reservo.wallet.errors import account_not_found, transfer_not_found

log = structlog.get_logger(__name__)

EXPIRE_PENDING = "wallet.expire-pending"


class ExpirePendingJob(ApiModel):
    """Payload of an EXPIRE_PENDING job: the pending transfer to void at its expiry."""

    transfer_id: Id


class NotYetDue(Exception):
    """The expiry job ran before the transfer's expiry (clocks apart): the
    scheduler runs it again after its backoff."""


def _job_key(transfer_id: int) -> str:
    return f"pending-transfer:{transfer_id}"


class PendingTransfers:
    def __init__(self, db: Database, clock: Clock, scheduler: JobQueue | None) -> None:
        self.db, self.clock, self.scheduler = db, clock, scheduler

    async def create(
        self,
        source: int,
        target: int,
        amount: int,
        timeout_s: int,
        within: Within[Transfer] | None = None,
    ) -> Transfer:
        """Reserve ``amount`` on ``source`` (its available money must cover it)
        for ``timeout_s``; the caller may act for ``source`` (checked by the route)."""
        now = self.clock.now()
        expires = now + timedelta(seconds=timeout_s)
        job: QueuedJob | None = None
        async with self.db.transaction() as conn:
            rows = {r["id"]: r for r in await repo.lock_accounts(conn, [source, target])}
            for account_id in (source, target):
                if account_id not in rows:
                    raise account_not_found(account_id)
            try:
                domain.check_transfer(
                    "TRANSFER",
                    domain.AccountRef.from_row(rows[source]),
                    domain.AccountRef.from_row(rows[target]),
                    amount,
                )
            except domain.TransferRefused as exc:
                raise DomainError(exc.code, exc.detail) from None
            if not await self._reserve(conn, source, amount, rows[source], now):
                currency = rows[source]["currency"]
                raise DomainError(
                    "insufficient_funds", f"account {source} does not hold {amount} {currency}"
                )
            transfer = Transfer.pending(
                await repo.insert_pending(conn, source, target, amount, expires, now)
            )
            if self.scheduler is not None:
                job = await self.scheduler.enqueue(
                    EXPIRE_PENDING,
                    ExpirePendingJob(transfer_id=transfer.id).wire(),
                    run_at=expires,
                    idempotency_key=_job_key(transfer.id),
                    conn=conn,
                )
            if within is not None:
                await within(conn, transfer)
        if job is not None and self.scheduler is not None:
            try:
                await self.scheduler.dispatch([job])
            except Exception as exc:  # the job is durable: the queue finds it later
                log.warning("wallet_pending_expiry_dispatch_failed", error=repr(exc))
        return transfer

    async def _reserve(
        self, conn: asyncpg.Connection, source: int, amount: int, row: repo.Row, now: datetime
    ) -> bool:
        if await repo.reserve(conn, source, amount):
            return True
        # Expired pending transfers reserve nothing: void them and try once more.
        return bool(
            row["pending_debits"]
            and await repo.release_expired(conn, [source], now)
            and await repo.reserve(conn, source, amount)
        )

    async def _visible(self, caller: Principal, transfer_id: int) -> repo.Row:
        """The pending transfer, if the caller may act for its source (its
        creator's account) or is an admin; anyone else's is 404 as one that does
        not exist."""
        async with self.db.connection() as conn:
            row = await repo.get_pending(conn, transfer_id)
        if row is None or not domain.may_act_for(caller, row["owner_id"]):
            raise transfer_not_found(transfer_id)
        return row

    async def post(self, caller: Principal, transfer_id: int, amount: int | None) -> Transfer:
        """Move ``amount`` (the whole pending amount when None) and release the
        rest: the transfer and its two entries are written now."""
        row = await self._visible(caller, transfer_id)
        posted = row["amount"] if amount is None else amount
        if posted > row["amount"]:
            raise DomainError(
                "amount_above_pending",
                f"transfer {transfer_id} holds {row['amount']}; at most that may be posted",
            )
        source, target = row["from_account_id"], row["to_account_id"]
        now = self.clock.now()
        async with self.db.transaction() as conn:
            locked = {r["id"]: r for r in await repo.lock_accounts(conn, [source, target])}
            try:
                domain.check_credit(target, locked[target]["balance"], posted)
            except domain.TransferRefused as exc:
                raise DomainError(exc.code, exc.detail) from None
            done = await repo.resolve_pending(conn, transfer_id, "POSTED", posted, now, False)
            if done is None:
                raise await self._why_not(conn, transfer_id)
            # The reservation covered it and is released: the debit cannot be
            # refused (the CHECKs would stop a bug here, not a customer).
            if not await repo.post_entries(
                conn, source, target, posted, transfer_id, row["created_at"], now
            ):
                raise RuntimeError(f"posting pending transfer {transfer_id} found no funds")
            await self._drop_job(conn, transfer_id)
        return Transfer.pending(done)

    async def void(self, caller: Principal, transfer_id: int) -> Transfer:
        """Release the whole reservation; nothing is written to the ledger."""
        row = await self._visible(caller, transfer_id)
        done = await self._void(row["from_account_id"], transfer_id, expired=None)
        if done is None:
            raise DomainError("not_pending", f"transfer {transfer_id} is no longer pending")
        return Transfer.pending(done)

    async def _void(self, source: int, transfer_id: int, expired: bool | None) -> repo.Row | None:
        now = self.clock.now()
        async with self.db.transaction() as conn:
            await repo.lock_accounts(conn, [source])
            done = await repo.resolve_pending(conn, transfer_id, "VOIDED", None, now, expired)
            if done is not None and expired is None:
                await self._drop_job(conn, transfer_id)
        return done

    async def expire(self, transfer_id: int) -> bool:
        """Void the transfer if it is still pending at its expiry (the expiry
        job; a no-op once posted or voided). True when this call voided it."""
        async with self.db.connection() as conn:
            row = await repo.get_pending(conn, transfer_id)
        if row is None or row["status"] != "PENDING":
            return False
        if await self._void(row["from_account_id"], transfer_id, expired=True) is not None:
            log.info("wallet_pending_expired", transfer_id=transfer_id)
            return True
        async with self.db.connection() as conn:
            row = await repo.get_pending(conn, transfer_id)
        if row is not None and row["status"] == "PENDING":
            raise NotYetDue(f"pending transfer {transfer_id} expires at {row['expires_at']}")
        return False

    async def expire_job(self, job: Any) -> None:
        """Handler of the per-transfer expiry job (a reservo.scheduler.Job)."""
        await self.expire(ExpirePendingJob.model_validate(job.payload).transfer_id)

    async def list_pending(self, account_id: int, after: int | None, limit: int) -> list[Transfer]:
        """The account's live pending transfers out, oldest first (keyset on id)."""
        async with self.db.connection() as conn:
            rows = await repo.list_pending(conn, account_id, self.clock.now(), after, limit)
        return [Transfer.pending(r) for r in rows]

    async def _why_not(self, conn: asyncpg.Connection, transfer_id: int) -> DomainError:
        row = await repo.get_pending(conn, transfer_id)
        if row is not None and row["status"] == "PENDING":
            return DomainError(
                "pending_expired", f"transfer {transfer_id} expired at {row['expires_at']}"
            )
        return DomainError("not_pending", f"transfer {transfer_id} is no longer pending")

    async def _drop_job(self, conn: asyncpg.Connection, transfer_id: int) -> None:
        """A resolved transfer has nothing left to expire: its job would only
        wake a worker to do nothing."""
        if self.scheduler is not None:
            await self.scheduler.cancel_by_key(EXPIRE_PENDING, _job_key(transfer_id), conn=conn)
