"""Natural batching: the items submitted while one batch runs form the next.

A group commit (many requests, one transaction) without an artificial delay:
under no load a batch is one item and runs at once; under load each batch is
what arrived during the previous one, so the cost of a batch (round trips, a
commit flush) is shared by more items the busier the process is.

The batch runs in a task of its own, detached from the submitters: a submitter
cancelled meanwhile (a client cut off mid-flight) stops waiting, but the batch
it joined still runs to its end and commits or rolls back as a whole.
"""

from __future__ import annotations

import asyncio
from abc import ABC, abstractmethod
from collections.abc import Awaitable, Callable, Hashable, Sequence
from typing import Generic, Protocol, TypeAlias, TypeVar

import asyncpg
import structlog

from reservo.core.db.database import unavailable
from reservo.core.http.idempotency import IdempotencyStore, is_in_progress
from reservo.core.kernel import metrics
from reservo.core.kernel.errors import DomainError

I = TypeVar("I")  # noqa: E741 - the item, as R is the result
R = TypeVar("R")
K = TypeVar("K", bound="Keyed")

log = structlog.get_logger(__name__)


class Again:
    """A batch's answer for an item it did not decide: the item goes into the
    next batch (e.g. a second request with the same key as one in this batch,
    which must see that one's outcome)."""


AGAIN = Again()
# What a batch answers for each of its items, in order: a result, an error the
# item's submitter raises, or AGAIN.
Outcome: TypeAlias = R | BaseException | Again


# Batches in flight per process by default. Measured on 2 cores, 2 API
# processes (docs/BENCHMARKS.md): transfers 488/s with one lane (each process
# mostly waiting for the other's row locks, the machine 68 % busy), 900 with 2,
# 1,193 with 4, 1,411 with 8; each lane holds a pool connection only while its
# batch runs.
LANES = 8


class Batcher(Generic[I, R]):
    """Runs ``run(items)`` on at most ``max_items`` items at a time, at most
    ``lanes`` batches at a time per process; ``submit`` returns its item's result
    or raises its error. More than one lane keeps the database busy while a batch
    waits for row locks another process's batch holds (one lane then leaves the
    process idle); each lane still groups what arrived while it was busy.

    ``run`` gets the items in arrival order and returns one ``Outcome`` per item.
    If ``run`` itself raises, every item of that batch raises it. ``name``
    labels its batches' sizes (``reservo_batch_items``)."""

    def __init__(
        self,
        run: Callable[[list[I]], Awaitable[Sequence[Outcome[R]]]],
        max_items: int = 128,
        lanes: int = LANES,
        *,
        name: str,
    ) -> None:
        if max_items < 1 or lanes < 1:
            raise ValueError("max_items and lanes must be >= 1")
        self._run, self.max_items, self.lanes = run, max_items, lanes
        self._sizes = metrics.BATCH_ITEMS.labels(name)
        self._pending: list[tuple[I, asyncio.Future[R]]] = []
        self._tasks: set[asyncio.Task[None]] = set()
        self._loop: asyncio.AbstractEventLoop | None = None

    async def submit(self, item: I) -> R:
        loop = asyncio.get_running_loop()
        if self._loop is not loop:  # items left behind by a loop that stopped
            self._loop, self._pending, self._tasks = loop, [], set()
        future: asyncio.Future[R] = loop.create_future()
        self._pending.append((item, future))
        self._tasks = {t for t in self._tasks if not t.done()}
        if len(self._tasks) < self.lanes:
            self._tasks.add(loop.create_task(self._drain()))
        # Cancelling the submitter cancels this future only; the batch goes on.
        return await future

    async def close(self) -> None:
        """Let the batches already submitted finish (their effects commit or not
        as a whole; their submitters get their answers)."""
        loop = asyncio.get_running_loop()
        running = [t for t in self._tasks if not t.done() and t.get_loop() is loop]
        if running:
            await asyncio.shield(asyncio.gather(*running))

    async def _drain(self) -> None:
        # One loop turn: the requests parsed in the same turn join the first batch.
        await asyncio.sleep(0)
        while self._pending:
            batch = self._pending[: self.max_items]
            del self._pending[: self.max_items]
            self._sizes.observe(len(batch))
            items = [item for item, _ in batch]
            try:
                outcomes = await self._run(items)
            except Exception as exc:  # a bug, not a refusal: every submitter raises it
                log.exception("batch_failed", items=len(items), error=repr(exc))
                outcomes = [exc] * len(items)
            except BaseException:
                # The loop is stopping: nobody may be left waiting for an answer.
                for _, future in [*batch, *self._pending]:
                    future.cancel()
                self._pending = []
                raise
            again: list[tuple[I, asyncio.Future[R]]] = []
            for (item, future), outcome in zip(batch, outcomes, strict=True):
                if isinstance(outcome, Again):
                    if not future.done():
                        again.append((item, future))
                elif future.done():  # its submitter was cancelled: nobody to tell
                    continue
                elif isinstance(outcome, BaseException):
                    future.set_exception(outcome)
                else:
                    future.set_result(outcome)
            self._pending[:0] = again


class Keyed(Protocol):
    """A request of a keyed group commit: its caller and Idempotency-Key."""

    @property
    def caller(self) -> str: ...

    @property
    def key(self) -> str | None: ...


def request_key(item: Keyed) -> tuple[str, str] | None:
    """The key of a request in a batch; requests without one never wait for
    one another."""
    return None if item.key is None else (item.caller, item.key)


class GroupCommit(ABC, Generic[K, R]):
    """The per-process batcher of one keyed endpoint (POST /api/transfers,
    POST /api/jobs): the requests submitted while a batch runs form the next
    one, each batch is ``_once(items)`` in one transaction (run again on a
    rollback, split on a failure of the whole: ``in_one_transaction``), and a
    request whose key an earlier request of the batch has waits for the next
    batch (``once_per_key``). ``event`` names the log lines, ``endpoint`` the
    endpoint its keys are stored under."""

    event: str

    def __init__(self, idempotency: IdempotencyStore, endpoint: str) -> None:
        self._batcher: Batcher[K, R] = Batcher(self._run, name=self.event)
        self.idempotency, self.endpoint = idempotency, endpoint
        # How many transactions the batches ran (tests read it).
        self.transactions = 0

    async def submit(self, request: K) -> R:
        """The answer to ``request``; a refusal is raised (DomainError). A
        request whose key is held by a request in flight (409 from its batch)
        waits for that one outside any batch, holding no connection
        (``IdempotencyStore.settled``), and is submitted again, where it meets
        that one's answer; 409 only once the wait is over."""
        deadline = self.idempotency.deadline()
        while True:
            try:
                return await self._batcher.submit(request)
            except DomainError as err:
                if (
                    request.key is None
                    or not is_in_progress(err)
                    or not await self.idempotency.settled(
                        request.caller, self.endpoint, request.key, deadline
                    )
                ):
                    raise

    async def close(self) -> None:
        await self._batcher.close()

    async def _run(self, items: list[K]) -> list[Outcome[R]]:
        return await once_per_key(items, request_key, self._attempt, self.event)

    async def _attempt(self, items: list[K]) -> list[Outcome[R]]:
        self.transactions += 1
        return await self._once(items)

    @abstractmethod
    async def _once(self, items: list[K]) -> list[Outcome[R]]:
        """The outcomes of ``items`` decided in one transaction."""


# A deadlock or serialization failure rolls a whole batch back; it is run again
# this many times before its requests get 503 (nothing of it committed).
ATTEMPTS = 3


async def once_per_key(
    items: list[I],
    key: Callable[[I], Hashable | None],
    once: Callable[[list[I]], Awaitable[list[Outcome[R]]]],
    event: str,
) -> list[Outcome[R]]:
    """A batch's outcomes: its items decided together (``in_one_transaction``)
    but for an item whose key (not None) an earlier item of the batch has, left
    AGAIN for the next batch, where it meets that item's stored answer (as a
    duplicate arriving just after it)."""
    seen: set[Hashable] = set()
    first: list[int] = []
    for n, item in enumerate(items):
        k = key(item)
        if k is None or k not in seen:
            if k is not None:
                seen.add(k)
            first.append(n)
    outcomes: list[Outcome[R]] = [AGAIN] * len(items)
    decided = await in_one_transaction([items[n] for n in first], once, event)
    for n, outcome in zip(first, decided, strict=True):
        outcomes[n] = outcome
    return outcomes


async def in_one_transaction(
    items: list[I],
    once: Callable[[list[I]], Awaitable[list[Outcome[R]]]],
    event: str,
) -> list[Outcome[R]]:
    """``once(items)``: the items' outcomes from one transaction, run again when
    the database rolled it back (deadlock, serialization). The database down is
    503 for every item (nothing committed); any other failure of the whole (a
    bug, a constraint) runs each item alone, so one bad item cannot refuse the
    others. ``event`` names the log lines."""
    for attempt in range(1, ATTEMPTS + 1):
        try:
            return await once(items)
        except asyncpg.exceptions.TransactionRollbackError as exc:
            # Nothing of the batch committed: run it again from the start.
            log.warning(f"{event}_rolled_back", attempt=attempt, error=repr(exc))
            await asyncio.sleep(0.001 * attempt)
        except DomainError as err:
            if err.status == 503 or len(items) == 1:
                return [err] * len(items)
            return await _one_by_one(items, once, event, err)
        except Exception as exc:
            if len(items) == 1:
                return [exc]
            return await _one_by_one(items, once, event, exc)
    return [unavailable() for _ in items]


async def _one_by_one(
    items: list[I],
    once: Callable[[list[I]], Awaitable[list[Outcome[R]]]],
    event: str,
    exc: BaseException,
) -> list[Outcome[R]]:
    log.warning(f"{event}_split", items=len(items), error=repr(exc))
    return [(await in_one_transaction([item], once, event))[0] for item in items]
