"""Batch, then one by one: one bad row never stops a background loop.

A loop that handles rows in batches fails the whole batch when one row cannot be
handled (a timestamp Python cannot decode, a value a rule refuses, a constraint
it breaks); retried as is, it fails again forever and every row behind it waits.
``isolate`` runs the batch; when it fails with a *row* error it runs each item
alone, and an item that fails alone is parked (by the caller's ``park``, which
must not need the bad values), logged and counted. Errors that are not about a
row (connection lost, timeout, database away) are never taken for poison: they
propagate, and the loop retries later with nothing parked.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Sequence
from typing import TypeVar

import structlog

from reservo.core.kernel.metrics import POISON_ROWS
from reservo.core.messaging.failures import PERMANENT

log = structlog.get_logger(__name__)

T = TypeVar("T")
R = TypeVar("R")

# Errors that belong to the data of a row, not to the path to the database: a
# value asyncpg cannot decode (OverflowError, ValueError) or encode (DataError),
# a rule refusing it (ValueError), a constraint it breaks. The same split as an
# event's permanent failures (core.messaging.failures).
ROW_ERRORS = PERMANENT


async def report(loop: str, item: object, exc: BaseException, parking: Awaitable[object]) -> None:
    """Awaits the parking of one item known to be bad, then logs and counts it."""
    await parking
    POISON_ROWS.labels(loop=loop).inc()
    log.warning("poison_row_parked", loop=loop, item=item, error=repr(exc)[:500])


async def isolate(
    items: Sequence[T],
    run: Callable[[Sequence[T]], Awaitable[list[R]]],
    park: Callable[[T, BaseException], Awaitable[object]],
    *,
    loop: str,
    one: Callable[[T], Awaitable[list[R]]] | None = None,
    key: Callable[[T], object] = lambda item: item,
    errors: tuple[type[BaseException], ...] = ROW_ERRORS,
) -> list[R]:
    """``run(items)``; when it raises one of ``errors``, each item alone
    (``one(item)``, by default ``run([item])``), parking those that still fail.
    The retry must be safe for items the failed batch already handled (a batch
    statement that committed before its result failed to decode). Returns the
    concatenated results of what ran."""
    if not items:
        return []
    try:
        return await run(items)
    except errors as exc:
        log.info("batch_failed_isolating", loop=loop, items=len(items), error=repr(exc)[:500])
    single = one or (lambda item: run([item]))
    out: list[R] = []
    for item in items:
        try:
            out.extend(await single(item))
        except errors as exc:
            await report(loop, key(item), exc, park(item, exc))
    return out
