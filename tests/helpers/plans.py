"""The plans PostgreSQL picks for a named query, as the index tests read them."""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime
from typing import Any

import asyncpg

# A custom plan, and the generic one a prepared statement switches to after five
# runs: an index test wants both to walk the index.
PLAN_MODES = ("force_custom_plan", "force_generic_plan")


async def plans_of(
    conn: asyncpg.Connection, name: str, sql: str, args: Sequence[Any]
) -> dict[str, str]:
    """The EXPLAIN text of ``sql`` run with ``args``, per plan cache mode."""
    await conn.execute(f"PREPARE plan_{name} AS {sql.strip().rstrip(';')}")
    values = ", ".join(sql_literal(v) for v in args)
    plans = {}
    try:
        for mode in PLAN_MODES:
            await conn.execute(f"SET plan_cache_mode = {mode}")
            rows = await conn.fetch(f"EXPLAIN EXECUTE plan_{name}({values})")
            plans[mode] = "\n".join(r[0] for r in rows)
    finally:
        await conn.execute("RESET plan_cache_mode")
    return plans


def sql_literal(v: Any) -> str:
    """Test values as SQL literals (EXPLAIN EXECUTE takes no bind parameters); a
    string that already is a range expression is passed as it is."""
    if isinstance(v, datetime):
        return f"'{v.isoformat()}'::timestamptz"
    if isinstance(v, str):
        return v if v.startswith("tstzrange(") else f"'{v}'"
    return str(int(v))
