"""Idempotency-Key semantics (docs/openapi.json, the Idempotency-Key header),
stored in PostgreSQL.

A request first *claims* (caller, endpoint, key) in its own short statement. The
business transaction then *completes* the claim with the response, so the
created thing and its stored response commit together. A retry finds either the
stored response (replayed; 201 becomes 200), a claim still in flight, or a
different body under the same key (422).

A retry that meets a claim in flight waits for it (``settled``), up to
``wait_ms`` (RESERVO_IDEMPOTENCY_WAIT_MS), and then asks again: it gets the
first request's stored answer, or runs itself when the first one's claim was
dropped or its lease ran out. Only past the wait is it 409 request_in_progress.
It learns that the first one finished by reading the key's row again, with a
growing pause between reads, each read on a pooled connection held for that one
statement; a waiter in the process that runs the first request is woken as
soon as that one ends (``in_flight``). Why not a row lock, LISTEN/NOTIFY or
Redis: docs/DESIGN.md, "Waiting for a request in flight".

A group commit, whose transaction alone writes what it answers, reads its keys
together (``known_many``) and writes each answer once (``store_many``; a claim
it took over is completed with ``complete_many``).
"""

from __future__ import annotations

import asyncio
import hashlib
import random
import re
import time
from collections.abc import Awaitable, Callable, Iterator, Mapping, MutableMapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any, TypeVar

import asyncpg
import orjson

from reservo.core.db.database import Database, Queries
from reservo.core.kernel import metrics
from reservo.core.kernel.clock import Clock
from reservo.core.kernel.errors import DomainError

_KEY = re.compile(r"^[\x21-\x7e]{1,255}$")
Q = Queries.load("reservo.core.http")
T = TypeVar("T")
# A hook a use case runs inside its own transaction with what it created. The
# API stores its idempotent response there, so the response and the effect
# commit together ("created but not recorded" cannot happen).
Within = Callable[[asyncpg.Connection, T], Awaitable[None]]


# The field as the server hands it over (lower case), and what joins repeated
# field lines into one value (RFC 9110, section 5.3).
_HEADER = b"idempotency-key"
_JOIN = b", "
# Methods no route takes a key on: their headers are not looked through.
_KEYLESS = frozenset(("GET", "HEAD", "OPTIONS"))


def combine_repeated_keys(scope: MutableMapping[str, Any]) -> None:
    """Joins an HTTP request's repeated ``Idempotency-Key`` field lines into one
    (``a, b``), as RFC 9110 reads them, in place. Every reader of the header
    (FastAPI takes the first line, a mapping the last) then sees the one value,
    which ``validate_key`` refuses: a request with two keys was otherwise
    deduplicated under one of them, and its retry under the other ran again."""
    if scope["method"] in _KEYLESS:
        return
    headers = scope["headers"]
    keys = [value for name, value in headers if name == _HEADER]
    if len(keys) > 1:
        scope["headers"] = [(n, v) for n, v in headers if n != _HEADER]
        scope["headers"].append((_HEADER, _JOIN.join(keys)))


def validate_key(key: str | None, *, required: bool) -> str | None:
    if key is None or key == "":
        if required:
            raise DomainError(
                "idempotency_key_required",
                "this endpoint requires an Idempotency-Key header",
            )
        return None
    if _JOIN.decode() in key:
        raise DomainError(
            "idempotency_key_required",
            "send one Idempotency-Key: the request named several",
        )
    if not _KEY.match(key):
        raise DomainError(
            "idempotency_key_required",
            "Idempotency-Key must be 1-255 visible ASCII characters",
        )
    return key


def request_hash(body: bytes) -> bytes:
    """Hash of the request body; JSON is canonicalised so key order and spacing
    of a retried body do not matter."""
    try:
        canonical = orjson.dumps(orjson.loads(body), option=orjson.OPT_SORT_KEYS)
    except orjson.JSONDecodeError:
        canonical = body
    return hashlib.sha256(canonical).digest()


_IN_PROGRESS = "request_in_progress"


def in_progress() -> DomainError:
    return DomainError(
        _IN_PROGRESS,
        "a request with this Idempotency-Key is still being processed",
        headers={"Retry-After": "1"},
    )


def is_in_progress(err: DomainError) -> bool:
    """Whether ``err`` is the 409 of a key whose first request is still running."""
    return err.code == _IN_PROGRESS


# The pauses between two reads of a key a waiter waits for: the first short (most
# requests take a few milliseconds), each next one twice as long, up to the
# cap (a read costs one primary-key lookup; 20 waiters of a stuck request read
# about 200 times in 2 s). Each pause is drawn between half and all of its
# length, so waiters released together do not read in step.
_FIRST_PAUSE_S = 0.005
_MAX_PAUSE_S = 0.2
# By whether a wait ended in time (reservo_idempotency_waits_total).
_WAITS = {
    True: metrics.IDEMPOTENCY_WAITS.labels("answered"),
    False: metrics.IDEMPOTENCY_WAITS.labels("expired"),
}


# The one rule for every way a key is claimed (run_idempotent, the job and
# transfer batches): refusals not stored are who may not act (401/403: a retry
# is judged on who asks then, and a stored 403 would keep answering after the
# grant) and passing conditions (429/503); every other refusal is the request's
# own and replays as it was.
_NOT_STORED = frozenset((401, 403, 429, 503))


def is_stored(err: DomainError) -> bool:
    """Whether a refusal raised once a key was claimed is stored for the key
    (replayed on a retry) rather than forgotten with the claim."""
    return err.status not in _NOT_STORED


def _replay(row: Mapping[str, Any]) -> Replay:
    """A DONE key's stored response as replayed: a stored 201 is replayed as 200."""
    status = row["response_status"]
    return Replay(200 if status == 201 else status, row["response_body"])


def _stored_answer(row: Mapping[str, Any], digest: bytes, now: datetime) -> Replay | None:
    """What a stored key answers a request with ``digest``: the replay of its
    response, or 422 (another body) or 409 (a claim in flight) raised. None: a
    claim whose lease ran out, which the request may take over."""
    if bytes(row["request_hash"]) != digest:
        raise DomainError(
            "idempotency_key_reused",
            "this Idempotency-Key was used with a different request body",
        )
    if row["status"] == "DONE":
        return _replay(row)
    if _lease_over(row, now):
        return None
    raise in_progress()


def _lease_over(row: Mapping[str, Any], now: datetime) -> bool:
    """Whether an IN_PROGRESS claim's request is taken for dead (its lease ran out)."""
    return row["locked_until"] is not None and row["locked_until"] < now


def _settled(row: Mapping[str, Any] | None, now: datetime) -> bool:
    """Whether a key is no longer held by a request in flight: gone (pruned, or
    its claim dropped), answered, or its claim's lease ran out."""
    return row is None or row["status"] == "DONE" or _lease_over(row, now)


@dataclass(frozen=True, slots=True)
class Wanted:
    """A key a group commit asks for (``IdempotencyStore.known_many``): whose,
    which, and the hash of its request's body (``request_hash``)."""

    caller: str
    key: str
    digest: bytes


@dataclass(frozen=True)
class Replay:
    status: int
    body: Any


@dataclass(frozen=True)
class Claim:
    caller: str
    endpoint: str
    key: str

    async def complete(self, conn: asyncpg.Connection, status: int, body: Any) -> None:
        """Store the response; call inside the business transaction."""
        await conn.execute(Q.idem_complete, self.caller, self.endpoint, self.key, status, body)

    async def forget(self, conn: asyncpg.Connection) -> None:
        """Drop the claim inside the business transaction (a refusal that is not
        stored): a retry runs again."""
        await conn.execute(Q.idem_release, self.caller, self.endpoint, self.key)

    def storing(self, status: int, render: Callable[[T], Any]) -> Within[T]:
        """The hook that completes this claim with ``render(created)``."""

        async def within(conn: asyncpg.Connection, created: T) -> None:
            await self.complete(conn, status, render(created))

        return within


class IdempotencyStore:
    def __init__(
        self,
        db: Database,
        clock: Clock,
        lease_s: int = 60,
        wait_ms: int = 2000,
    ) -> None:
        self.db, self.clock = db, clock
        self.lease = timedelta(seconds=lease_s)
        self.wait_s = wait_ms / 1000
        # The claims this process's requests hold, each with the event set when
        # its request ends: a waiter in this process is woken by it at once.
        self._running: dict[tuple[str, str, str], asyncio.Event] = {}

    def deadline(self) -> float:
        """Until when (``time.monotonic()``) a request that starts now waits for
        a request in flight with its key."""
        return time.monotonic() + self.wait_s

    async def begin(self, caller: str, endpoint: str, key: str, body: bytes) -> Claim | Replay:
        """Claims the key, or answers from it: the stored response (replayed),
        422 another body; a claim in flight is waited for (``settled``) and
        asked again, 409 only once the wait is over."""
        digest = request_hash(body)
        deadline = self.deadline()
        while True:
            try:
                outcome = await self._begin_once(caller, endpoint, key, digest)
            except DomainError as err:
                if not is_in_progress(err) or not await self.settled(
                    caller, endpoint, key, deadline
                ):
                    raise
                continue
            if outcome is not None:
                return outcome

    async def _begin_once(
        self, caller: str, endpoint: str, key: str, digest: bytes
    ) -> Claim | Replay | None:
        """One try of ``begin``; None when the key was pruned between its two
        statements (free again: try again)."""
        now = self.clock.now()
        async with self.db.connection() as conn:
            if await conn.fetchval(
                Q.idem_insert, caller, endpoint, key, digest, now + self.lease, now
            ):
                return Claim(caller, endpoint, key)
            return await self._known(conn, Claim(caller, endpoint, key), digest, now)

    @contextmanager
    def in_flight(self, claim: Claim) -> Iterator[None]:
        """Around the run of a claimed request (after ``begin``), to its end
        (its answer committed, stored or the claim dropped): the waiters for its
        key in this process wake when it ends instead of at their next read."""
        at = (claim.caller, claim.endpoint, claim.key)
        self._running[at] = ended = asyncio.Event()
        try:
            yield
        finally:
            if self._running.get(at) is ended:
                del self._running[at]
            ended.set()

    async def settled(self, caller: str, endpoint: str, key: str, deadline: float) -> bool:
        """Waits for the request in flight with this key to end: True once the
        key is no longer held (answered, its claim dropped, or its lease run out:
        ask again), False once ``deadline`` (``time.monotonic()``) passed first
        (answer 409). Between two reads of the key it holds no connection: the
        request it waits for may need the pool's last one."""
        settled = await self._wait(caller, endpoint, key, deadline)
        _WAITS[settled].inc()
        return settled

    async def _wait(self, caller: str, endpoint: str, key: str, deadline: float) -> bool:
        pause = _FIRST_PAUSE_S
        while (left := deadline - time.monotonic()) > 0:
            await self._pause((caller, endpoint, key), min(pause * random.uniform(0.5, 1), left))
            pause = min(pause * 2, _MAX_PAUSE_S)
            try:
                # A read that cannot start (the pool exhausted) is bounded by the
                # wait too: past it, the answer is 409 all the same.
                async with asyncio.timeout(max(deadline - time.monotonic(), 0.001)):
                    row = await self._state(caller, endpoint, key)
            except TimeoutError:
                return False
            if _settled(row, self.clock.now()):
                return True
        return False

    async def _pause(self, at: tuple[str, str, str], seconds: float) -> None:
        """Sleeps ``seconds``, or less when the claim's request runs in this
        process and ends first."""
        ended = self._running.get(at)
        if ended is None:
            await asyncio.sleep(seconds)
            return
        try:
            async with asyncio.timeout(seconds):
                await ended.wait()
        except TimeoutError:
            pass

    async def _state(self, caller: str, endpoint: str, key: str) -> asyncpg.Record | None:
        async with self.db.connection() as conn:
            row: asyncpg.Record | None = await conn.fetchrow(Q.idem_get, caller, endpoint, key)
            return row

    async def finished(self, caller: str, endpoint: str, key: str, body: bytes) -> Replay | None:
        """The stored answer of the finished request under this key with this
        body, or None (nothing stored, another body, still running). It only
        reads: a request refused before it may claim its key (a rate limit)
        still gets the answer its key's first request got."""
        async with self.db.connection() as conn:
            row = await conn.fetchrow(Q.idem_get, caller, endpoint, key)
        if row is None or row["status"] != "DONE":
            return None
        if bytes(row["request_hash"]) != request_hash(body):
            return None
        return _replay(row)

    async def keys_since(
        self, endpoint: str, after: tuple[datetime, str, str], limit: int
    ) -> list[tuple[datetime, str, str]]:
        """The endpoint's keys claimed after ``after`` (created_at, caller, key),
        in that order, at most ``limit``: whatever their state, as a key's
        claim commits before its work starts."""
        async with self.db.connection() as conn:
            rows = await conn.fetch(Q.idem_keys_since, endpoint, *after, limit)
        return [(r["created_at"], r["caller"], r["key"]) for r in rows]

    async def _known(
        self, conn: asyncpg.Connection, claim: Claim, digest: bytes, now: datetime
    ) -> Claim | Replay | None:
        """What a key already stored answers: its response, a take-over of a claim
        whose request died, or 409/422 (raised). None when the key is gone."""
        row = await conn.fetchrow(Q.idem_get, claim.caller, claim.endpoint, claim.key)
        if row is None:
            return None
        return await self._answer_row(conn, claim, row, digest, now)

    async def _answer_row(
        self,
        conn: asyncpg.Connection,
        claim: Claim,
        row: asyncpg.Record,
        digest: bytes,
        now: datetime,
    ) -> Claim | Replay:
        """What a stored key's row answers: its response, a take-over of a claim
        whose request died, or 409/422 (raised)."""
        known = _stored_answer(row, digest, now)
        if known is not None:
            return known
        if await self._take_over(conn, claim, row["locked_until"], now):
            return claim
        raise in_progress()

    async def _answer_or_error(
        self,
        conn: asyncpg.Connection,
        claim: Claim,
        row: asyncpg.Record,
        digest: bytes,
        now: datetime,
    ) -> Claim | Replay | DomainError:
        """``_answer_row`` for one key of a batch: its refusal is returned, not
        raised (the other keys go on)."""
        try:
            return await self._answer_row(conn, claim, row, digest, now)
        except DomainError as err:
            return err

    async def _take_over(
        self, conn: asyncpg.Connection, claim: Claim, locked_until: datetime, now: datetime
    ) -> bool:
        return bool(
            await conn.fetchval(
                Q.idem_take_over,
                claim.caller,
                claim.endpoint,
                claim.key,
                locked_until,
                now + self.lease,
            )
        )

    async def known_many(
        self, conn: asyncpg.Connection, endpoint: str, wanted: Sequence[Wanted], now: datetime
    ) -> list[Claim | Replay | DomainError | Wanted]:
        """What many keys of one endpoint hold, read without writing a claim for
        a free key, for a group commit whose claims would never be seen (they
        commit with their answers): one answer per key, in order: the Wanted
        itself when the key is free (store its answer with ``store_many`` in
        this transaction), the Replay of a stored response, the DomainError to
        answer (422 another body, 409 a claim in flight elsewhere), or a Claim
        when this took over a claim whose lease ran out (complete it with
        ``complete_many``). The keys must be distinct."""
        rows = await conn.fetch(
            Q.idem_known_many, [w.caller for w in wanted], [w.key for w in wanted], endpoint
        )
        return await self.known_rows(conn, endpoint, wanted, rows, now)

    async def known_rows(
        self,
        conn: asyncpg.Connection,
        endpoint: str,
        wanted: Sequence[Wanted],
        rows: Sequence[asyncpg.Record],
        now: datetime,
    ) -> list[Claim | Replay | DomainError | Wanted]:
        """``known_many`` on rows the caller read with its own statement (one
        per key, in order, with ``idem_known_many``'s columns: ``status`` NULL
        for a free key), to save a round trip."""
        answers: list[Claim | Replay | DomainError | Wanted] = []
        for w, row in zip(wanted, rows, strict=True):
            if row["status"] is None:
                answers.append(w)
                continue
            claim = Claim(w.caller, endpoint, w.key)
            answers.append(await self._answer_or_error(conn, claim, row, w.digest, now))
        return answers

    async def store_many(
        self,
        conn: asyncpg.Connection,
        endpoint: str,
        wanted: Sequence[Wanted],
        statuses: Sequence[int],
        bodies: Sequence[bytes],
        now: datetime,
    ) -> set[tuple[str, str]]:
        """Writes the answers of keys ``known_many`` found free, DONE, inside the
        business transaction; returns the (caller, key) pairs written. A key
        missing from it was written meanwhile by another transaction (this one
        waited for it): its request must not take effect here (roll its effect
        back, and ask again in a later transaction, which replays that one)."""
        if not wanted:
            return set()
        rows = await conn.fetch(
            Q.idem_store_many,
            endpoint,
            [w.caller for w in wanted],
            [w.key for w in wanted],
            [w.digest for w in wanted],
            list(statuses),
            [b.decode() for b in bodies],
            now,
        )
        return {(r["caller"], r["key"]) for r in rows}

    async def complete_many(
        self,
        conn: asyncpg.Connection,
        endpoint: str,
        claims: Sequence[Claim],
        statuses: Sequence[int],
        bodies: Sequence[bytes],
    ) -> None:
        """``Claim.complete`` of many claims of one endpoint in one statement
        (bodies already serialised JSON), inside the business transaction."""
        if not claims:
            return
        await conn.execute(
            Q.idem_complete_many,
            endpoint,
            [c.caller for c in claims],
            [c.key for c in claims],
            list(statuses),
            [b.decode() for b in bodies],
        )

    async def finish(self, claim: Claim, status: int, body: Any) -> None:
        """Store a refusal (a deterministic 4xx) outside any business transaction."""
        async with self.db.connection() as conn:
            await claim.complete(conn, status, body)

    async def release(self, claim: Claim) -> None:
        """Forget a claim whose request failed for a passing reason, so a retry may run."""
        async with self.db.connection() as conn:
            await conn.execute(Q.idem_release, claim.caller, claim.endpoint, claim.key)
