"""Reads the checks' pages (queries.sql) and feeds their findings to a Report.

Each page is its own READ ONLY transaction on a connection the caller hands
out (a pool's, or the CLI's own, on the primary or a replica): a page is one
statement, so what it compares is one snapshot, and no snapshot is held for
the run (a long one would hold back vacuum on the primary, and be cancelled
by replay on a replica). Memory is one page plus the report's samples."""

from __future__ import annotations

import json
import time
from collections.abc import AsyncIterator, Callable, Sequence
from contextlib import AbstractAsyncContextManager
from datetime import datetime
from typing import Any

import asyncpg

from reservo.core.db.database import Queries
from reservo.verify.domain import Check, Limits, Part, Report, finding, parameters

Q = Queries.load("reservo.verify")
Connect = Callable[[], AbstractAsyncContextManager[asyncpg.Connection]]
# Told after each page: the check and how many rows that page held.
Progress = Callable[[str, int], None]


def _quiet(check: str, rows: int) -> None:
    pass


async def verify(
    connect: Connect,
    checks: Sequence[Check],
    limits: Limits,
    now: datetime,
    *,
    page_size: int = 1000,
    sample: int = 100,
    progress: Progress = _quiet,
) -> Report:
    """Every check of ``checks``, page after page, as of ``now``."""
    report = Report(checks, sample=sample, started_at=now)
    values = parameters(now, limits)
    t0 = time.monotonic()
    for check in checks:
        for part in check.parts:
            args = [values[p] for p in part.params]
            async for seen, rows in _pages(connect, part, page_size, args):
                report.saw(check.name, seen)
                for r in rows:
                    facts = r["facts"]
                    if isinstance(facts, str):  # a connection without a jsonb codec
                        facts = json.loads(facts)
                    report.add(finding(check.name, r["subject"], r["ids"], facts))
                progress(check.name, seen)
    report.duration_s = time.monotonic() - t0
    return report


async def _pages(
    connect: Connect, part: Part, page_size: int, args: list[Any]
) -> AsyncIterator[tuple[int, list[asyncpg.Record]]]:
    """The pages of one part: (rows the page held, its violation rows), until a
    page comes back short. A connection per page: a pool's is held for
    milliseconds, never for the minutes a large table's walk takes."""
    sql = getattr(Q, part.query)
    cursor = part.start
    while True:
        async with connect() as conn, conn.transaction(readonly=True):
            await conn.execute(Q.page_settings)
            rows = await conn.fetch(sql, cursor, page_size, *args)
        head = rows[0]
        if head["after"] is None:
            return
        yield head["seen"], [r for r in rows if r["subject"] is not None]
        if head["seen"] < page_size:
            return
        cursor = head["after"]
