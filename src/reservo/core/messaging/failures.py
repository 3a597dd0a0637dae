"""Transient or permanent: the one rule that decides what happens to a failed event.

A transient failure (a dependency away: connection refused, timeout, 5xx, broker
unavailable, breaker open, database unreachable) says nothing about the event;
it is retried with capped backoff for as long as the outage lasts, and counted.
A permanent failure (the handler rejects the event: malformed, refused by a
rule, a bug that fails the same way every time) is parked at once as a dead
letter, with its error, for an operator to inspect and replay. Retrying a
permanent failure only delays everything behind it; parking a transient one
turns an ordinary outage into work for a person."""

from __future__ import annotations

import asyncpg

from reservo.core.kernel.errors import DomainError


class Rejected(Exception):
    """Raised by a handler that refuses an event for good (it will never apply)."""


# Failures that come from the data, not the moment: the same event fails the same way.
PERMANENT: tuple[type[BaseException], ...] = (
    Rejected,
    LookupError,  # KeyError, IndexError: a field the event lacks
    TypeError,
    ValueError,  # includes UnicodeError and pydantic's ValidationError
    ArithmeticError,  # OverflowError: a value (a timestamp) Python cannot represent
    AssertionError,
    asyncpg.IntegrityConstraintViolationError,
    asyncpg.DataError,
)


def is_transient(exc: BaseException) -> bool:
    """True when retrying later may succeed without anyone changing anything."""
    if isinstance(exc, DomainError):
        # 503 unavailable, 429 rate limited: the moment; any other refusal: the event.
        return exc.status >= 500 or exc.status == 429
    return not isinstance(exc, PERMANENT)
