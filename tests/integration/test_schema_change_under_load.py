"""A release's expand migration (a column added) while this code serves: a
statement prepared before it fails once inside a transaction; that is a 503 with
Retry-After (the client retries), never a 500, and the retry succeeds."""

from __future__ import annotations

import asyncpg
import pytest

from reservo.core.db.database import Database
from reservo.core.kernel.errors import DomainError


async def test_a_column_added_under_a_prepared_statement_is_a_retryable_503(
    own_database: str,
) -> None:
    db = Database(own_database, min_size=1, max_size=1)
    sql = "SELECT * FROM doctor ORDER BY id LIMIT 1"
    try:
        async with db.transaction() as conn:
            await conn.fetch(sql)  # prepared and cached on the pool's one connection
        other = await asyncpg.connect(own_database)
        try:
            await other.execute("ALTER TABLE doctor ADD COLUMN added_by_release int")
        finally:
            await other.close()
        with pytest.raises(DomainError) as refused:
            async with db.transaction() as conn:
                await conn.fetch(sql)
        assert refused.value.code == "unavailable"
        assert refused.value.headers == {"Retry-After": "1"}
        async with db.transaction() as conn:  # the retry
            assert await conn.fetch(sql) == []
    finally:
        await db.close()
