"""POST /api/transfers as a group commit: many transfers, one transaction.

The requests a process receives while its previous batch runs form the next
batch (``core.http.batching``); a batch runs in ONE transaction, set-based, and
takes its account locks as late as it can (they are what concurrent batches
queue on):

1. read, in one statement (``read_batch``), the batch's accounts without a lock
   (owner, currency and kind never change; the balances are a guess), one new
   transfer id per request, and what every key holds (nothing is claimed: a
   claim made in this transaction would never be seen, it commits with its
   answer);
2. per request, in arrival order, the checks the one-request flow runs before
   its key: the source exists and the caller may act for it (404 / 403, not
   stored); then its key: a known key replays its stored response or is 422, a
   claim in flight elsewhere is 409, which its request waits out of the batch
   and comes back with (``GroupCommit.submit``; one whose lease ran out is
   taken over);
3. plan the transfers in arrival order in Python with the domain's rules on the
   guessed balances (a debit spends only the available money: the balance less
   the pending debits); a refusal (404 target, 422 same account, 403 system
   account, 409 currency or funds) is that request's alone, stored for its key
   when ``is_stored`` says so (the one rule: not the 403, whose claim is dropped).
   Each funds check bounds its source's balance at the start of the batch from
   below (passed) or above (refused): any balances within the bounds give the
   same decisions;
4. lock the accounts (``lock_balances``: ascending ids, the order
   ``transfer_in_tx`` and ``pay_many_in_tx`` lock in: no deadlock with stakes,
   deposits or payouts); if a batch that committed meanwhile moved a balance out
   of its bounds or changed a pending debit, plan again on the locked balances
   (held now); a source refused for funds whose pending transfers include
   expired ones has those voided (an expired one reserves nothing) and the
   batch is planned again;
5. write balances, transfers, entries and every answer in one statement
   (``write_transfers``: a free key's row inserted DONE, once); COMMIT. A key
   another transaction wrote since step 1 fails that statement: the batch rolls
   back and runs again, where the key replays the other's answer.

So an account is locked for two statements and the commit, a batch is three
statements between its BEGIN and COMMIT, and a key's row is written once.

The answers, their statuses and bodies are those of the one-request flow. The
batch runs detached from the requests: a client cut off mid-flight no longer
waits, but holds nothing either (the batch's transaction is not its to abort).
A batch that fails as a whole (the database down) answers each request 503 and
committed nothing; a deadlock or serialization failure is retried.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime
from typing import Any

import asyncpg
import orjson
import structlog

from reservo.core.db.database import Database
from reservo.core.http.auth import Principal
from reservo.core.http.batching import AGAIN, GroupCommit, Outcome
from reservo.core.http.idempotency import Claim, IdempotencyStore, Replay, Wanted, is_stored
from reservo.core.kernel.clock import Clock
from reservo.core.kernel.errors import DomainError
from reservo.wallet import domain, repo
from reservo.wallet.domain import Transfer
from reservo.wallet.errors import account_not_found

ENDPOINT = "POST /api/transfers"
EVENT = "transfer_batch"

log = structlog.get_logger(__name__)


@dataclass(frozen=True, slots=True)
class TransferRequest:
    """A transfer request already authenticated and parsed."""

    principal: Principal
    key: str
    digest: bytes  # idempotency.request_hash of the raw body
    source: int
    target: int
    amount: int

    @property
    def caller(self) -> str:
        return self.principal.key_owner


@dataclass(frozen=True, slots=True)
class Answer:
    """The response of a request: 201 with the transfer, or a replay."""

    status: int
    body: Any


def _replayed(stored: Replay) -> Answer:
    return Answer(stored.status, stored.body)


class TransferBatch(GroupCommit[TransferRequest, Answer]):
    """The per-process batcher of transfers."""

    event = EVENT

    def __init__(
        self,
        db: Database,
        clock: Clock,
        idempotency: IdempotencyStore,
        render: Callable[[Transfer], Any],
    ) -> None:
        super().__init__(idempotency, ENDPOINT)
        self.db, self.clock, self.render = db, clock, render

    async def _once(self, items: list[TransferRequest]) -> list[Outcome[Answer]]:
        try:
            return await self._in_transaction(items)
        except asyncpg.UniqueViolationError as exc:
            if exc.constraint_name != repo.KEY_TAKEN:
                raise
            # A key this batch read free was written by another transaction
            # since: nothing of the batch committed; the next batch replays
            # that one's answer and decides the others again.
            log.info(f"{EVENT}_key_taken", items=len(items))
            return [AGAIN] * len(items)

    async def _in_transaction(self, items: list[TransferRequest]) -> list[Outcome[Answer]]:
        now = self.clock.now()
        outcomes: list[Outcome[Answer]] = [AGAIN] * len(items)
        async with self.db.transaction() as conn:
            # No lock yet: owner, currency and kind never change, and the
            # balances are only what the plan guesses (settle checks it). One
            # transfer id per request: no plan makes more transfers.
            read = await repo.read_batch(
                conn,
                [i for item in items for i in (item.source, item.target)],
                len(items),
                ENDPOINT,
                [(item.caller, item.key) for item in items],
            )
            ids = read.transfer_ids
            rows = {r["id"]: r for r in read.accounts}
            # Before the key, as the one-request flow: the source exists and the
            # caller may act for it, else 404 either way (refusals not stored:
            # who may not act learns nothing from a retry).
            allowed: list[int] = []
            for n, item in enumerate(items):
                source = rows.get(item.source)
                try:
                    if source is None or not domain.may_act_for(item.principal, source["owner_id"]):
                        raise account_not_found(item.source)
                except DomainError as err:
                    outcomes[n] = err
                    continue
                allowed.append(n)
            claims = await self._keys(conn, items, allowed, read.keys, now, outcomes)
            guessed = repo.Locked(
                {i: r["balance"] for i, r in rows.items()},
                {i: r["pending_debits"] for i, r in rows.items()},
            )
            plan = _plan(items, claims, rows, guessed)
            # The locks, as late as they can be: from here to the commit.
            locked = await self._lock(conn, plan)
            if not _holds(plan, locked, guessed):
                # A batch that committed since the read moved a balance out of the
                # range the plan holds for, or a pending transfer changed what a
                # source may spend: plan again on the locked balances (every
                # account a plan of these claims can touch is locked).
                log.info(f"{EVENT}_replanned", items=len(items))
                plan = _plan(items, claims, rows, locked)
            locked, plan = await self._release_expired(conn, items, claims, rows, locked, plan, now)
            decided, transfers, stored = self._answers(items, claims, plan, ids, now)
            for n, refusal in plan.refusals:
                key = claims[n]
                # A free key's refusal that is not stored writes nothing; a claim
                # taken over from a dead request is dropped, as the one-request
                # flow drops it (a retry is judged again).
                if not is_stored(refusal) and isinstance(key, Claim):
                    await key.forget(conn)
            await self._write(conn, locked, plan, transfers, now, stored)
        for n, answer in decided.items():
            outcomes[n] = answer
        return outcomes

    async def _keys(
        self,
        conn: asyncpg.Connection,
        items: list[TransferRequest],
        allowed: list[int],
        known: list[repo.Row],
        now: datetime,
        outcomes: list[Outcome[Answer]],
    ) -> dict[int, Claim | Wanted]:
        """What the keys of the ``allowed`` items hold (``known``: read_batch's
        row per item): a known key's replay or refusal is its item's outcome;
        the others, by item: free (its answer is inserted once, with the
        transfers) or a claim whose lease ran out, taken over (completed with
        the transfers)."""
        wanted = [Wanted(items[n].caller, items[n].key, items[n].digest) for n in allowed]
        rows = [known[n] for n in allowed]
        answers = await self.idempotency.known_rows(conn, ENDPOINT, wanted, rows, now)
        keys: dict[int, Claim | Wanted] = {}
        for n, answer in zip(allowed, answers, strict=True):
            if isinstance(answer, Claim | Wanted):
                keys[n] = answer
            elif isinstance(answer, Replay):
                outcomes[n] = _replayed(answer)
            else:
                outcomes[n] = answer
        return keys

    async def _lock(self, conn: asyncpg.Connection, plan: _Plan) -> repo.Locked:
        return await repo.lock_balances(conn, [a.id for a in plan.accounts])

    async def _release_expired(
        self,
        conn: asyncpg.Connection,
        items: list[TransferRequest],
        claims: dict[int, Claim | Wanted],
        rows: dict[int, repo.Row],
        locked: repo.Locked,
        plan: _Plan,
        now: datetime,
    ) -> tuple[repo.Locked, _Plan]:
        """A pending transfer past its expiry reserves nothing, even before its
        expiry job voids it: a source refused for funds while holding pending
        debits has its expired ones voided here (it is locked) and the batch
        planned again. Only on a refusal: the common batch pays nothing for it."""
        short = {
            items[n].source
            for n, err in plan.refusals
            if err.code == "insufficient_funds" and locked.pending.get(items[n].source)
        }
        if not short:
            return locked, plan
        released = await repo.release_expired(conn, sorted(short), now)
        if not released:
            return locked, plan
        pending = {i: p - released.get(i, 0) for i, p in locked.pending.items()}
        locked = repo.Locked(locked.balances, pending)
        return locked, _plan(items, claims, rows, locked)

    async def _write(
        self,
        conn: asyncpg.Connection,
        locked: repo.Locked,
        plan: _Plan,
        transfers: list[repo.PlannedTransfer],
        now: datetime,
        stored: list[repo.StoredAnswer],
    ) -> None:
        await repo.write_transfers(conn, locked, plan.accounts, transfers, now, ENDPOINT, stored)

    def _answers(
        self,
        items: list[TransferRequest],
        claims: dict[int, Claim | Wanted],
        plan: _Plan,
        ids: list[int],
        now: datetime,
    ) -> tuple[dict[int, Outcome[Answer]], list[repo.PlannedTransfer], list[repo.StoredAnswer]]:
        """The plan's outcomes by item, its transfers with their ids, and the
        answers to store for their keys."""
        decided: dict[int, Outcome[Answer]] = {}
        stored: list[repo.StoredAnswer] = []
        transfers: list[repo.PlannedTransfer] = []
        for (n, item, source_offset, target_offset), transfer_id in zip(
            plan.moves, ids[: len(plan.moves)], strict=True
        ):
            transfers.append(
                repo.PlannedTransfer(
                    transfer_id,
                    item.source,
                    item.target,
                    item.amount,
                    source_offset,
                    target_offset,
                )
            )
            body = self.render(
                Transfer(transfer_id, "TRANSFER", None, item.source, item.target, item.amount, now)
            )
            decided[n] = Answer(201, body)
            stored.append(_stored(claims[n], 201, body))
        for n, err in plan.refusals:
            decided[n] = err
            if is_stored(err):  # else nothing is written (a taken-over claim is dropped)
                stored.append(_stored(claims[n], err.status, err.problem()))
        return decided, transfers, stored


def _holds(plan: _Plan, locked: repo.Locked, planned: repo.Locked) -> bool:
    """Whether every funds check of ``plan`` (made on ``planned``) decides the
    same on ``locked``: each balance within its bounds, each pending debit unchanged."""
    for a in plan.accounts:
        balance = locked.balances.get(a.id)
        if balance is None or locked.pending.get(a.id) != planned.pending.get(a.id):
            return False
        if (a.lo is not None and balance < a.lo) or (a.hi is not None and balance >= a.hi):
            return False
    return True


def _stored(key: Claim | Wanted, status: int, body: Any) -> repo.StoredAnswer:
    digest = key.digest if isinstance(key, Wanted) else None
    return repo.StoredAnswer(key.caller, key.key, status, orjson.dumps(body).decode(), digest)


@dataclass(frozen=True, slots=True)
class _Plan:
    """The claimed transfers decided on some balances: the accounts with the
    range of balances for which every decision stays the same, the transfers
    (item index, item, source and target offsets after it) and the refusals."""

    accounts: list[repo.AccountBounds]
    moves: list[tuple[int, TransferRequest, int, int]]
    refusals: list[tuple[int, DomainError]]


def _plan(
    items: list[TransferRequest],
    claims: dict[int, Claim | Wanted],
    rows: dict[int, repo.Row],
    start: repo.Locked,
) -> _Plan:
    """``transfer_in_tx``'s checks and movements, in arrival order, on
    ``accounts``. A funds check passes iff the source's available money (its
    balance less its pending debits) at the start of the batch is at least the
    amount minus what the batch already moved in or out of it (its offset):
    each check bounds the start balance from below (passed) or above (refused),
    and any start balances inside all the bounds, with the same pending debits,
    give these same decisions."""
    balances, pending = start.balances, start.pending
    offsets: dict[int, int] = {}
    lo: dict[int, int] = {}
    hi: dict[int, int] = {}
    moves: list[tuple[int, TransferRequest, int, int]] = []
    refusals: list[tuple[int, DomainError]] = []
    for n in claims:  # in arrival order: the transfers apply in the order they came
        item = items[n]
        try:
            _check(item, rows)
        except DomainError as err:
            refusals.append((n, err))
            continue
        source, target = item.source, item.target
        offsets.setdefault(source, 0)
        offsets.setdefault(target, 0)
        # The start balance this debit needs: its pending debits stay reserved.
        needed = item.amount - offsets[source] + pending[source]
        if balances[source] < needed:
            hi[source] = min(hi.get(source, needed), needed)
            # Names only the source, the caller's own account (the target may be anybody's).
            currency = rows[source]["currency"]
            refusals.append(
                (
                    n,
                    DomainError(
                        "insufficient_funds",
                        f"account {source} does not hold {item.amount} {currency}",
                    ),
                )
            )
            continue
        lo[source] = max(lo.get(source, needed), needed)
        # The largest start balance of the target that can take the credit: the
        # bound it puts on the target, as the funds check on the source.
        room = domain.BALANCE_MAX - item.amount - offsets[target]
        if balances[target] > room:
            lo[target] = max(lo.get(target, room + 1), room + 1)
            refused = domain.credit_refused(target, item.amount)
            refusals.append((n, DomainError(refused.code, refused.detail)))
            continue
        hi[target] = min(hi.get(target, room + 1), room + 1)
        offsets[source] -= item.amount
        offsets[target] += item.amount
        moves.append((n, item, offsets[source], offsets[target]))
    accounts = [repo.AccountBounds(a, lo.get(a), hi.get(a), offsets[a]) for a in sorted(offsets)]
    return _Plan(accounts, moves, refusals)


def _check(item: TransferRequest, rows: dict[int, repo.Row]) -> None:
    """The checks of ``transfer_in_tx`` no balance decides (raises the refusal)."""
    target = rows.get(item.target)
    if target is None:
        raise account_not_found(item.target)
    try:
        domain.check_transfer(
            "TRANSFER",
            domain.AccountRef.from_row(rows[item.source]),
            domain.AccountRef.from_row(target),
            item.amount,
        )
    except domain.TransferRefused as exc:
        raise DomainError(exc.code, exc.detail) from None
