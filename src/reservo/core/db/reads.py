"""Reading one thing by id, or the use case's "no such thing" refusal.

Kept apart from ``core.db.rows`` (which the pure domain modules import): this one
does I/O."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import TypeVar

import asyncpg

from reservo.core.db.database import Database
from reservo.core.kernel.errors import DomainError

R = TypeVar("R")


async def read_one(
    db: Database,
    read: Callable[[asyncpg.Connection, int], Awaitable[R | None]],
    key: int,
    code: str,
    detail: str,
) -> R:
    """What ``read`` finds for ``key`` on a connection of its own; nothing is the
    refusal ``code`` (a use case's "no such thing")."""
    async with db.connection() as conn:
        found = await read(conn, key)
    if found is None:
        raise DomainError(code, detail)
    return found
