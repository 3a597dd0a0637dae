"""Transactions that lock several slot rows: a deadlock the lock order did not
foresee is retried; one that comes back every time is 503 contention."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import TypeVar

import asyncpg

from reservo.core.kernel import metrics
from reservo.core.kernel.errors import DomainError

T = TypeVar("T")
DEADLOCK_RETRIES = 3


async def retrying_deadlocks(once: Callable[[], Awaitable[T]]) -> T:
    """``once`` (a whole transaction) run again after a deadlock, at most
    DEADLOCK_RETRIES times in all; then 503 contention (passing: an
    Idempotency-Key stores nothing, a retry runs again)."""
    for _ in range(DEADLOCK_RETRIES - 1):
        try:
            return await once()
        except asyncpg.exceptions.DeadlockDetectedError:
            continue
    try:
        return await once()
    except asyncpg.exceptions.DeadlockDetectedError:
        metrics.CONFLICTS.labels("appointments", "contention", "database").inc()
        raise DomainError(
            "contention",
            "the slots stayed locked by other requests; try again",
            headers={"Retry-After": "1"},
        ) from None
