"""Counting the statements an app sends to PostgreSQL, through its real pool."""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from typing import Any

import asyncpg

from reservo.bootstrap import Container


class Statements:
    """Counts the statements an app sends to PostgreSQL: its Database hands out
    connections through this wrapper, which logs each query run on them."""

    def __init__(self, container: Container) -> None:
        self.queries: list[str] = []
        real: Callable[[], Any] = container.db.connection

        @asynccontextmanager
        async def counted() -> AsyncIterator[asyncpg.Connection]:
            async with real() as conn:
                conn.add_query_logger(self._log)
                try:
                    yield conn
                finally:
                    conn.remove_query_logger(self._log)

        container.db.connection = counted  # type: ignore[method-assign,assignment]

    def _log(self, record: Any) -> None:
        self.queries.append(record.query)

    def take(self) -> list[str]:
        out, self.queries = self.queries, []
        return out
