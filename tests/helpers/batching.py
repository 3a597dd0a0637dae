"""Checks shared by the group-commit tests (wallet transfers, job intake)."""

from __future__ import annotations

from typing import Any

import asyncpg
import httpx
import orjson

from reservo.core.db.database import Database
from reservo.core.kernel.errors import DomainError


async def assert_grouped(db: asyncpg.Connection, table: str, ids: list[int]) -> None:
    """The rows were written by fewer transactions than half their number (a
    group commit): without batching every row has its own xmin."""
    # The table name is the test's own constant, never input.
    transactions = await db.fetchval(
        f"SELECT count(DISTINCT xmin::text) FROM {table} WHERE id = ANY($1::bigint[])", ids
    )
    assert transactions < len(ids) / 2, transactions


async def assert_stored_and_replayed(
    client: httpx.AsyncClient,
    db: asyncpg.Connection,
    path: str,
    body: dict[str, Any],
    headers: dict[str, str],
    created: httpx.Response,
) -> None:
    """The request's Idempotency-Key stored exactly its 201, and a retry replays it (200)."""
    stored = await db.fetchrow(
        "SELECT status, response_status, response_body FROM idempotency_key"
        " WHERE endpoint = $1 AND key = $2",
        f"POST {path}",
        headers["Idempotency-Key"],
    )
    assert (stored["status"], stored["response_status"]) == ("DONE", 201)
    assert orjson.loads(stored["response_body"]) == created.json()
    again = await client.post(path, json=body, headers=headers)
    assert (again.status_code, again.json()) == (200, created.json())


def unreachable_database() -> Database:
    """A Database whose server is not there (nothing listens on port 1)."""
    return Database(
        "postgresql://postgres@127.0.0.1:1/postgres", connect_timeout=1, acquire_timeout=1
    )


def assert_all_unavailable(results: list[Any]) -> None:
    """Every request got 503 unavailable with a Retry-After (the database was down)."""
    for result in results:
        assert isinstance(result, DomainError), result
        assert (result.status, result.code) == (503, "unavailable")
        assert result.headers == {"Retry-After": "1"}
