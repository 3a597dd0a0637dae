"""The only place that runs the betting module's SQL."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import datetime
from decimal import Decimal
from typing import Any, TypeAlias

import asyncpg

from reservo.core.db.database import Queries

Q = Queries.load("reservo.betting")

Row: TypeAlias = asyncpg.Record


async def insert_match(
    conn: asyncpg.Connection,
    external_id: str,
    home: str,
    away: str,
    starts_at: datetime,
    odds: dict[str, dict[str, str]],
    now: datetime,
) -> Row:
    return await conn.fetchrow(Q.insert_match, external_id, home, away, starts_at, odds, now)


async def get_match(conn: asyncpg.Connection, match_id: int) -> Row | None:
    return await conn.fetchrow(Q.get_match, match_id)


async def match_by_external_id(conn: asyncpg.Connection, external_id: str) -> Row | None:
    return await conn.fetchrow(Q.match_by_external_id, external_id)


async def matches_for_bet(conn: asyncpg.Connection, ids: list[int]) -> list[Row]:
    return list(await conn.fetch(Q.matches_for_bet, ids))


async def update_match(
    conn: asyncpg.Connection,
    match_id: int,
    odds: dict[str, dict[str, str]] | None,
    suspended: bool | None,
    now: datetime,
) -> Row | None:
    return await conn.fetchrow(Q.update_match, match_id, odds, suspended, now)


async def matches_page(
    conn: asyncpg.Connection, status: str, now: datetime, after: tuple[datetime, int], limit: int
) -> list[Row]:
    """A page of one list of matches: UPCOMING or STARTED (unsettled, split at
    ``now``), else the settled ones."""
    if status == "UPCOMING":
        return list(await conn.fetch(Q.matches_upcoming, now, after[0], after[1], limit))
    if status == "STARTED":
        return list(await conn.fetch(Q.matches_started, now, after[0], after[1], limit))
    return list(await conn.fetch(Q.matches_settled, after[0], after[1], limit))


async def account_bets(
    conn: asyncpg.Connection, account_id: int, before: int, limit: int, status: str | None
) -> list[Row]:
    if status is None:
        return list(await conn.fetch(Q.account_bets, account_id, before, limit))
    return list(await conn.fetch(Q.account_bets_by_status, account_id, before, limit, status))


async def selections_of_bets(conn: asyncpg.Connection, bet_ids: list[int]) -> list[Row]:
    return list(await conn.fetch(Q.selections_of_bets, bet_ids))


async def insert_bet(
    conn: asyncpg.Connection,
    account_id: int,
    owner_id: int,
    currency: str,
    stake: int,
    potential: int,
    now: datetime,
    legs: int,
) -> Row:
    return await conn.fetchrow(
        Q.insert_bet, account_id, owner_id, currency, stake, potential, now, legs
    )


async def insert_selections(
    conn: asyncpg.Connection,
    bet_id: int,
    matches: list[int],
    markets: list[str],
    picks: list[str],
    odds: list[Decimal],
) -> None:
    await conn.execute(Q.insert_selections, bet_id, matches, markets, picks, odds)


async def get_bet(conn: asyncpg.Connection, bet_id: int) -> Row | None:
    return await conn.fetchrow(Q.get_bet, bet_id)


async def bet_selections(conn: asyncpg.Connection, bet_id: int) -> list[Row]:
    return list(await conn.fetch(Q.bet_selections, bet_id))


async def claim_result(
    conn: asyncpg.Connection, provider_event_id: str, external_id: str, now: datetime
) -> bool:
    got = await conn.fetchval(Q.claim_result, provider_event_id, external_id, "APPLIED", now)
    return got is not None


async def set_inbox_outcome(conn: asyncpg.Connection, provider_event_id: str, outcome: str) -> None:
    await conn.execute(Q.set_inbox_outcome, provider_event_id, outcome)


async def record_result(
    conn: asyncpg.Connection,
    external_id: str,
    status: str,
    home: int | None,
    away: int | None,
    provider_event_id: str,
    now: datetime,
) -> int | None:
    return await conn.fetchval(
        Q.record_result, external_id, status, home, away, provider_event_id, now
    )


async def match_result(conn: asyncpg.Connection, match_id: int) -> Row | None:
    return await conn.fetchrow(Q.match_result, match_id)


@dataclass(frozen=True, slots=True)
class Settled:
    """Settled bets, one list per column (the same index is the same bet)."""

    ids: list[int]
    accounts: list[int]
    owners: list[int]
    statuses: list[str]
    payouts: list[int]

    @classmethod
    def from_row(cls, row: Row, at: int = 0) -> Settled:
        """From the five array columns of ``row`` starting at position ``at``."""
        return cls(*(list(row[at + i]) for i in range(5)))

    def rows(self) -> Iterator[tuple[int, int, int, str, int]]:
        """(id, account_id, owner_id, status, payout) per bet."""
        return zip(self.ids, self.accounts, self.owners, self.statuses, self.payouts, strict=True)

    def __add__(self, other: Settled) -> Settled:
        return Settled(
            self.ids + other.ids,
            self.accounts + other.accounts,
            self.owners + other.owners,
            self.statuses + other.statuses,
            self.payouts + other.payouts,
        )


@dataclass(frozen=True, slots=True)
class Graded:
    """A graded chunk: how many legs, the last bet graded, the accumulators to
    recompute and the singles already settled."""

    count: int
    last: int | None
    accumulators: list[int]
    singles: Settled


async def grade_chunk(
    conn: asyncpg.Connection,
    match_id: int,
    limit: int,
    void: bool,
    picks: dict[str, str],
    after: int,
    now: datetime,
) -> Graded:
    row = await conn.fetchrow(
        Q.grade_chunk,
        match_id,
        limit,
        void,
        picks.get("1X2", ""),
        picks.get("TOTALS_2_5", ""),
        picks.get("BTTS", ""),
        after,
        now,
    )
    return Graded(row[0], row[1], list(row[2]), Settled.from_row(row, 3))


async def lock_bets(conn: asyncpg.Connection, bet_ids: list[int]) -> None:
    await conn.execute(Q.lock_bets, bet_ids)


async def settle_bets(conn: asyncpg.Connection, bet_ids: list[int], now: datetime) -> Settled:
    return Settled.from_row(await conn.fetchrow(Q.settle_bets, bet_ids, now))


async def add_progress(conn: asyncpg.Connection, match_id: int, n: int) -> None:
    await conn.execute(Q.add_progress, match_id, n)


async def finish_settlement(conn: asyncpg.Connection, match_id: int, now: datetime) -> bool:
    return str(await conn.execute(Q.finish_settlement, match_id, now)).endswith(" 1")


async def settling_matches(conn: asyncpg.Connection, limit: int) -> list[int]:
    return [r["id"] for r in await conn.fetch(Q.settling_matches, limit)]


async def fallback_insert(
    conn: asyncpg.Connection,
    row_id: uuid.UUID,
    provider_event_id: str,
    payload: dict[str, Any],
    now: datetime,
) -> None:
    await conn.execute(Q.fallback_insert, row_id, provider_event_id, payload, now)


async def fallback_claim(
    conn: asyncpg.Connection, limit: int, now: datetime, lease_s: float
) -> list[Row]:
    """Leased PENDING rows, oldest first (the first result of a match wins)."""
    rows = await conn.fetch(Q.fallback_claim, limit, now, lease_s)
    return sorted(rows, key=lambda r: (r["created_at"], r["id"]))


async def fallback_resent(
    conn: asyncpg.Connection, row_ids: list[uuid.UUID], now: datetime
) -> None:
    await conn.execute(Q.fallback_resent, row_ids, now)


async def fallback_failed(
    conn: asyncpg.Connection,
    row_id: uuid.UUID,
    error: str,
    permanent: bool,
    retry_at: datetime,
) -> str | None:
    """The row's new status; None when it was no longer PENDING."""
    status = await conn.fetchval(Q.fallback_failed, row_id, error, permanent, retry_at)
    return None if status is None else str(status)


async def fallback_release(conn: asyncpg.Connection, row_ids: list[uuid.UUID]) -> None:
    await conn.execute(Q.fallback_release, row_ids)


async def record_rejected(
    conn: asyncpg.Connection, source: str, body: str, error: str, now: datetime
) -> None:
    await conn.execute(Q.record_rejected, source, body, error, now)
