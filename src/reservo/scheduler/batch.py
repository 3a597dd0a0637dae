"""POST /api/jobs as a group commit: many enqueues, one transaction.

The requests a process receives while its previous batch runs form the next
batch (``core.http.batching``); a batch runs in ONE transaction, set-based:

1. read every key of the batch in one statement (``known_many``): a known key
   replays its stored response or is 422, a claim in flight elsewhere is 409,
   which its request waits out of the batch and comes back with
   (``GroupCommit.submit``); a free key is not claimed (a claim in this
   transaction would never be seen by anybody: it commits with its answer), its
   answer is written once, in step 3;
2. per request, in arrival order, the checks of the one-request flow after its
   key (a handler for the category, the handler's check of the payload, the
   time): a refusal is that request's alone, stored for its key;
3. insert every new job in one statement, and every answer in one more
   (``store_many``: a key another transaction wrote since step 1 keeps that
   one's answer; this request's job is deleted and the request goes to the next
   batch, which replays it); COMMIT. The jobs due within the window are
   written QUEUED with one job_push row naming them (``Scheduler.create_many``):
   they are never written again for their push;
4. push the batch's jobs to Redis together (``Scheduler.push_soon``): a request
   returns once its job was pushed, or the push failed and was left to the
   loader (which pushes the jobs of a job_push row older than the grace, so a
   crash between commit and push loses nothing).

The answers, their statuses and bodies are those of the one-request flow. The
batch runs detached from the requests: a client cut off mid-flight no longer
waits, but its job still commits and is pushed, and a retry replays it. A batch
that fails as a whole (the database down) answers each request 503 and
committed nothing; a deadlock or serialization failure is retried.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any

import asyncpg
import orjson

from reservo.core.http.auth import Principal
from reservo.core.http.batching import AGAIN, GroupCommit, Outcome
from reservo.core.http.idempotency import Claim, IdempotencyStore, Replay, Wanted, is_stored
from reservo.core.kernel.errors import DomainError
from reservo.scheduler.domain import NO_EXTRAS, QUEUED, Extras, Job
from reservo.scheduler.service import Scheduler

ENDPOINT = "POST /api/jobs"
EVENT = "job_batch"


@dataclass(frozen=True, slots=True)
class JobRequest:
    """An enqueue already authenticated, parsed and checked as the API checks
    before any key (payload size and shape, run_at or delay)."""

    principal: Principal
    key: str | None
    digest: bytes  # idempotency.request_hash of the raw body (unused without a key)
    category: str
    payload: dict[str, Any]
    urgency: int
    run_at: datetime | None
    delay: timedelta | None
    extras: Extras = NO_EXTRAS  # uniqueKey and after

    @property
    def caller(self) -> str:
        return self.principal.key_owner


@dataclass(frozen=True, slots=True)
class Answer:
    """The response of a request: 201 with the job created, or a replay; and
    for a job created, its push to Redis (done once pushed or deferred)."""

    status: int
    body: Any
    pushed: asyncio.Future[None] | None = None


def _replayed(stored: Replay) -> Answer:
    return Answer(stored.status, stored.body)


class JobBatch(GroupCommit[JobRequest, Answer]):
    """The per-process batcher of enqueues through the API."""

    event = EVENT

    def __init__(
        self,
        scheduler: Scheduler,
        idempotency: IdempotencyStore,
        render: Callable[[Job, bool], Any],
    ) -> None:
        super().__init__(idempotency, ENDPOINT)
        self.scheduler, self.render = scheduler, render

    async def submit(self, request: JobRequest) -> Answer:
        """The answer to ``request`` once its job is pushed (or deferred to the
        loader); a refusal is raised (DomainError)."""
        answer = await super().submit(request)
        if answer.pushed is not None:
            # Shielded: a request cut off here leaves the push to finish.
            await asyncio.shield(answer.pushed)
        return answer

    async def _once(self, items: list[JobRequest]) -> list[Outcome[Answer]]:
        svc = self.scheduler
        pushes_done = svc.take_pushes_done()
        try:
            return await self._in_transaction(items, pushes_done)
        except BaseException:
            svc.keep_pushes_done(pushes_done)  # not deleted: the next batch tries
            raise

    async def _in_transaction(
        self, items: list[JobRequest], pushes_done: list[int]
    ) -> list[Outcome[Answer]]:
        svc = self.scheduler
        now = svc.clock.now()
        outcomes: list[Outcome[Answer]] = [AGAIN] * len(items)
        async with svc.db.transaction() as conn:
            keys = await self._read_keys(conn, items, now, outcomes)
            new = await self._checked(conn, items, keys, now, outcomes)
            firsts, repeats = _first_of_each_key(items, new)
            made, push_id = await svc.create_many(
                conn,
                [row for _, row in firsts],
                now,
                pushes_done,
                [items[n].extras for n, _ in firsts],
            )
            got = {n: job_made for (n, _), job_made in zip(firsts, made, strict=True)}
            for n, first in repeats.items():
                got[n] = (got[first][0], False)  # the batch's first of that key
            bodies: dict[int, tuple[Job, int, Any]] = {}
            for n, (job, fresh) in sorted(got.items()):
                status, body = (
                    (201, self.render(job, False)) if fresh else (200, self.render(job, True))
                )
                bodies[n] = (job, status, body)
                keys.answer(n, status, orjson.dumps(body))
            await self._write_answers(conn, keys, bodies, now, outcomes)
        # Committed: the jobs created due go to Redis together.
        due = [job for job, status, _ in bodies.values() if status == 201 and job.status == QUEUED]
        pushed = svc.push_soon(due, push_id) if push_id is not None else None
        for n, (_, status, body) in bodies.items():
            outcomes[n] = Answer(status, body, pushed if status == 201 else None)
        return outcomes

    async def _read_keys(
        self,
        conn: asyncpg.Connection,
        items: list[JobRequest],
        now: datetime,
        outcomes: list[Outcome[Answer]],
    ) -> _Keys:
        """Step 1: the batch's keys read at once; a known key's replay or refusal
        is its request's outcome."""
        keyed = [
            (n, Wanted(item.caller, item.key, item.digest))
            for n, item in enumerate(items)
            if item.key is not None
        ]
        known = (
            await self.idempotency.known_many(conn, ENDPOINT, [w for _, w in keyed], now)
            if keyed
            else []
        )
        # A free key gets its answer written once, with the job (no claim
        # first: nobody could see it before it commits with its answer); a
        # stale claim this took over is completed as before.
        keys = _Keys()
        for (n, _), answer in zip(keyed, known, strict=True):
            if isinstance(answer, Wanted):
                keys.free[n] = answer
            elif isinstance(answer, Claim):
                keys.claims[n] = answer
            elif isinstance(answer, Replay):
                outcomes[n] = _replayed(answer)
            else:
                outcomes[n] = answer
        return keys

    async def _checked(
        self,
        conn: asyncpg.Connection,
        items: list[JobRequest],
        keys: _Keys,
        now: datetime,
        outcomes: list[Outcome[Answer]],
    ) -> list[tuple[int, tuple[str, int, datetime, dict[str, Any]]]]:
        """Step 2, after the key as the one-request flow: the checks of the job
        itself. The jobs to create, by item; a refusal is its item's outcome."""
        new: list[tuple[int, tuple[str, int, datetime, dict[str, Any]]]] = []
        unknown = await self.scheduler.unknown_jobs(
            conn, sorted({parent for item in items for parent in item.extras.after})
        )
        for n, item in enumerate(items):
            if item.key is not None and n not in keys.free and n not in keys.claims:
                continue  # replayed or refused by its key
            try:
                when = self.scheduler.run_at_of(
                    item.category, item.payload, item.run_at, item.delay, now
                )
                _known_parents(item, unknown)
            except DomainError as err:
                outcomes[n] = err
                if is_stored(err):
                    keys.answer(n, err.status, orjson.dumps(err.problem()))
                elif n in keys.claims:
                    await keys.claims[n].forget(conn)
                continue
            new.append((n, (item.category, item.urgency, when, item.payload)))
        return new

    async def _write_answers(
        self,
        conn: asyncpg.Connection,
        keys: _Keys,
        bodies: dict[int, tuple[Job, int, Any]],
        now: datetime,
        outcomes: list[Outcome[Answer]],
    ) -> None:
        """Step 3's answers: stored for the free keys, completed for the claims."""
        stored, free = keys.stored, keys.free
        written = await self.idempotency.store_many(
            conn,
            ENDPOINT,
            [free[n] for n, _, _ in stored],
            [status for _, status, _ in stored],
            [body for _, _, body in stored],
            now,
        )
        # A key another transaction wrote since it was read: that one is
        # the answer, in the next batch (a replay); its job here goes.
        lost = [n for n, _, _ in stored if (free[n].caller, free[n].key) not in written]
        for n in lost:
            outcomes[n] = AGAIN
        # Only a job this batch created goes (a deduplicated answer names
        # another request's job).
        dropped = [
            job.id
            for job, status, _ in (bodies.pop(n) for n in lost if n in bodies)
            if status == 201
        ]
        if dropped:
            await self.scheduler.drop_new(conn, dropped)
        answered = keys.answered
        await self.idempotency.complete_many(
            conn,
            ENDPOINT,
            [a[0] for a in answered],
            [a[1] for a in answered],
            [a[2] for a in answered],
        )


def _known_parents(item: JobRequest, unknown: set[int]) -> None:
    """422 unknown_dependency when the request names a job that does not exist."""
    missing = [parent for parent in item.extras.after if parent in unknown]
    if missing:
        raise DomainError(
            "unknown_dependency", f"after names jobs that do not exist: {missing[:10]}"
        )


def _first_of_each_key(
    items: list[JobRequest], new: list[tuple[int, tuple[str, int, datetime, dict[str, Any]]]]
) -> tuple[list[tuple[int, tuple[str, int, datetime, dict[str, Any]]]], dict[int, int]]:
    """The jobs to insert: of the batch's requests with one category and unique
    key, only the first (the others, by item, name that first one's item: they
    are answered with its job, deduplicated), as two posts in sequence would be."""
    firsts: list[tuple[int, tuple[str, int, datetime, dict[str, Any]]]] = []
    repeats: dict[int, int] = {}
    seen: dict[tuple[str, str], int] = {}
    for n, row in new:
        key = items[n].extras.unique_key
        if key is not None and (items[n].category, key) in seen:
            repeats[n] = seen[(items[n].category, key)]
            continue
        if key is not None:
            seen[(items[n].category, key)] = n
        firsts.append((n, row))
    return firsts, repeats


@dataclass
class _Keys:
    """A batch's keyed requests by the state of their key, and the answers to
    write for them: stored once for a free key, completed for a claim."""

    free: dict[int, Wanted] = field(default_factory=dict)
    claims: dict[int, Claim] = field(default_factory=dict)
    stored: list[tuple[int, int, bytes]] = field(default_factory=list)
    answered: list[tuple[Claim, int, bytes]] = field(default_factory=list)

    def answer(self, n: int, status: int, body: bytes) -> None:
        """Item ``n``'s answer, written for its key (none without a key)."""
        if n in self.claims:
            self.answered.append((self.claims[n], status, body))
        elif n in self.free:
            self.stored.append((n, status, body))
