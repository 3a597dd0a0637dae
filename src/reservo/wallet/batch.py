"""POST /api/transfers as a group commit: many transfers, one transaction.

The requests a process receives while its previous batch runs form the next
batch (``core.batching``); a batch runs in ONE transaction, set-based:

1. lock every account of the batch in one ``lock_accounts`` (ascending ids, the
   order ``transfer_in_tx`` and ``pay_many_in_tx`` lock in: no deadlock with
   stakes, deposits or payouts);
2. per request, in arrival order, the checks run before the key is claimed
   today: the source exists and the caller may act for it (404 / 403, not stored);
3. claim every remaining key in one statement (``claim_many``): a known key
   replays its stored response or is 422, a claim in flight elsewhere is 409;
4. apply the transfers in arrival order in Python with the domain's rules on
   the locked balances; a refusal (404 target, 422 same account, 403 system
   account, 409 currency or funds) is that request's alone, stored for its key;
5. write balances, transfers and entries in one statement, and every stored
   response in one more; COMMIT.

The answers, their statuses and bodies are those of the one-request flow. The
batch runs detached from the requests: a client cut off mid-flight no longer
waits, but holds nothing either (the batch's transaction is not its to abort).
A batch that fails as a whole (the database down) answers each request 503 and
committed nothing; a deadlock or serialization failure is retried.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import orjson

from reservo.core.auth import Principal
from reservo.core.batching import AGAIN, Batcher, Outcome, once_per_key, take_claims
from reservo.core.clock import Clock
from reservo.core.db import Database
from reservo.core.errors import DomainError
from reservo.core.idempotency import Claim, IdempotencyStore, Replay, Wanted
from reservo.wallet import domain, repo
from reservo.wallet.domain import Transfer
from reservo.wallet.service import _not_found, _ref

ENDPOINT = "POST /api/transfers"
EVENT = "transfer_batch"


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


class TransferBatch:
    """The per-process batcher of transfers."""

    def __init__(
        self,
        db: Database,
        clock: Clock,
        idempotency: IdempotencyStore,
        render: Callable[[Transfer], Any],
    ) -> None:
        self.db, self.clock, self.idempotency, self.render = db, clock, idempotency, render
        self._batcher: Batcher[TransferRequest, Answer] = Batcher(self._run)
        # How many transactions the batches ran (tests read it).
        self.transactions = 0

    async def submit(self, request: TransferRequest) -> Answer:
        """The answer to ``request``; a refusal is raised (DomainError)."""
        return await self._batcher.submit(request)

    async def close(self) -> None:
        await self._batcher.close()

    async def _run(self, items: list[TransferRequest]) -> list[Outcome[Answer]]:
        return await once_per_key(items, lambda item: (item.caller, item.key), self._attempt, EVENT)

    async def _attempt(self, items: list[TransferRequest]) -> list[Outcome[Answer]]:
        self.transactions += 1
        return await self._once(items)

    async def _once(self, items: list[TransferRequest]) -> list[Outcome[Answer]]:
        now = self.clock.now()
        outcomes: list[Outcome[Answer]] = [AGAIN] * len(items)
        async with self.db.transaction() as conn:
            locked = await repo.lock_accounts(
                conn, [i for item in items for i in (item.source, item.target)]
            )
            rows = {r["id"]: r for r in locked}
            # Before the key, as the one-request flow: the source exists and the
            # caller may act for it (refusals not stored: who may not act learns
            # nothing from a retry).
            allowed: list[int] = []
            for n, item in enumerate(items):
                source = rows.get(item.source)
                try:
                    if source is None:
                        raise _not_found(item.source)
                    domain.may_act_for(item.principal, source["owner_id"])
                except DomainError as err:
                    outcomes[n] = err
                    continue
                allowed.append(n)
            answers = await self.idempotency.claim_many(
                conn,
                ENDPOINT,
                [Wanted(items[n].caller, items[n].key, items[n].digest) for n in allowed],
                now,
            )
            # In arrival order: the transfers apply in the order they came.
            claims = take_claims(allowed, answers, outcomes, _replayed)
            balances = {i: r["balance"] for i, r in rows.items()}
            moves: list[tuple[int, TransferRequest, int, int]] = []
            stored: list[tuple[int, Claim, int, Any]] = []
            for n, claim in claims.items():
                item = items[n]
                try:
                    source_after, target_after = _apply(item, rows, balances)
                except DomainError as err:
                    outcomes[n] = err
                    stored.append((n, claim, err.status, err.problem()))
                    continue
                moves.append((n, item, source_after, target_after))
            ids = await repo.apply_transfers(
                conn,
                [m[1].source for m in moves],
                [m[1].target for m in moves],
                [m[1].amount for m in moves],
                [m[2] for m in moves],
                [m[3] for m in moves],
                {i: b for i, b in balances.items() if b != rows[i]["balance"]},
                now,
            )
            for (n, item, _, _), transfer_id in zip(moves, ids, strict=True):
                transfer = Transfer(
                    transfer_id, "TRANSFER", None, item.source, item.target, item.amount, now
                )
                body = self.render(transfer)
                outcomes[n] = Answer(201, body)
                stored.append((n, claims[n], 201, body))
            await self.idempotency.complete_many(
                conn,
                ENDPOINT,
                [s[1] for s in stored],
                [s[2] for s in stored],
                [orjson.dumps(s[3]) for s in stored],
            )
        return outcomes


def _apply(
    item: TransferRequest, rows: dict[int, repo.Row], balances: dict[int, int]
) -> tuple[int, int]:
    """``transfer_in_tx``'s checks and movement on the batch's locked balances:
    the balances of source and target after it (raises the refusal)."""
    target = rows.get(item.target)
    if target is None:
        raise _not_found(item.target)
    source = rows[item.source]
    try:
        domain.check_transfer("TRANSFER", _ref(source), _ref(target), item.amount)
    except domain.TransferRefused as exc:
        raise DomainError(exc.code, exc.detail) from None
    if balances[item.source] < item.amount:
        # Names only the source, the caller's own account (the target may be anybody's).
        raise DomainError(
            "insufficient_funds",
            f"account {item.source} does not hold {item.amount} {source['currency']}",
        )
    balances[item.source] -= item.amount
    balances[item.target] += item.amount
    return balances[item.source], balances[item.target]
