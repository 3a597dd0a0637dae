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


async def lock_match_results(conn: asyncpg.Connection, external_id: str) -> None:
    await conn.execute(Q.lock_match_results, external_id)


async def inbox_outcome(conn: asyncpg.Connection, provider_event_id: str) -> str | None:
    got = await conn.fetchval(Q.inbox_outcome, provider_event_id)
    return None if got is None else str(got)


async def record_outcome(
    conn: asyncpg.Connection, provider_event_id: str, external_id: str, outcome: str, now: datetime
) -> None:
    await conn.execute(Q.record_outcome, provider_event_id, external_id, outcome, now)


async def pending_insert(
    conn: asyncpg.Connection,
    provider_event_id: str,
    external_id: str,
    payload: dict[str, Any],
    now: datetime,
) -> None:
    await conn.execute(Q.pending_insert, provider_event_id, external_id, payload, now)


async def pending_take(conn: asyncpg.Connection, external_id: str) -> list[Row]:
    """The results kept for the match, oldest first; deleted with the caller's commit."""
    return sorted(await conn.fetch(Q.pending_take, external_id), key=lambda r: r["id"])


async def record_result(
    conn: asyncpg.Connection,
    external_id: str,
    status: str,
    home: int | None,
    away: int | None,
    provider_event_id: str,
    now: datetime,
    sequence: int | None = None,
) -> int | None:
    return await conn.fetchval(
        Q.record_result, external_id, status, home, away, provider_event_id, now, sequence
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
    # The settlement generation each bet is paid in (its payout's wallet reference).
    generations: list[int]

    @classmethod
    def from_row(cls, row: Row, at: int = 0) -> Settled:
        """From the six array columns of ``row`` starting at position ``at``."""
        return cls(*(list(row[at + i]) for i in range(6)))

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
            self.generations + other.generations,
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


async def lock_many_match_results(conn: asyncpg.Connection, external_ids: list[str]) -> None:
    await conn.execute(Q.lock_many_match_results, external_ids)


async def results_settling(conn: asyncpg.Connection, match_ids: list[int]) -> list[Row]:
    return list(await conn.fetch(Q.results_settling, match_ids))


@dataclass(frozen=True, slots=True)
class GradedMatches:
    """A graded batch of matches: the match of each graded leg, the accumulators
    to recompute (ascending) with a match of theirs, the settled singles and the
    match of each."""

    legs: list[int]
    accumulators: list[int]
    accumulator_matches: list[int]
    singles: Settled
    single_matches: list[int]


@dataclass(frozen=True, slots=True)
class MatchGrading:
    """How each match of a batch grades its legs (parallel lists)."""

    ids: list[int]
    void: list[bool]
    picks_1x2: list[str]
    picks_totals: list[str]
    picks_btts: list[str]


async def grade_matches(
    conn: asyncpg.Connection, grading: MatchGrading, limit: int, now: datetime
) -> GradedMatches:
    row = await conn.fetchrow(
        Q.grade_matches,
        grading.ids,
        grading.void,
        grading.picks_1x2,
        grading.picks_totals,
        grading.picks_btts,
        limit,
        now,
    )
    return GradedMatches(
        list(row[0]), list(row[1]), list(row[2]), Settled.from_row(row, 3), list(row[9])
    )


async def add_progress_many(conn: asyncpg.Connection, counts: dict[int, int]) -> None:
    await conn.execute(Q.add_progress_many, list(counts), list(counts.values()))


async def finish_settlements(
    conn: asyncpg.Connection, match_ids: list[int], now: datetime
) -> set[int]:
    return {r["id"] for r in await conn.fetch(Q.finish_settlements, match_ids, now)}


async def results_seen(
    conn: asyncpg.Connection, external_ids: list[str], provider_event_ids: list[str]
) -> list[Row]:
    return list(await conn.fetch(Q.results_seen, external_ids, provider_event_ids))


async def record_results(
    conn: asyncpg.Connection,
    results: list[tuple[str, str, int | None, int | None, str]],
    now: datetime,
) -> list[int]:
    """``results``: (external id, status, home, away, providerEventId) each."""
    if not results:
        return []
    columns = [list(c) for c in zip(*results, strict=True)]
    return [r["id"] for r in await conn.fetch(Q.record_results, *columns, now)]


async def lock_match_for_resettle(conn: asyncpg.Connection, match_id: int) -> Row | None:
    return await conn.fetchrow(Q.lock_match_for_resettle, match_id)


async def lock_bets_of_match(
    conn: asyncpg.Connection, match_id: int, statement_timeout_s: float | None = None
) -> list[Row]:
    return list(await conn.fetch(Q.lock_bets_of_match, match_id, timeout=statement_timeout_s))


async def reopen_match(
    conn: asyncpg.Connection,
    match_id: int,
    reopened_bets: list[int],
    result: tuple[str, int | None, int | None],
    provider_event_id: str | None,
    sequence: int | None,
    voided_reason: str | None,
    now: datetime,
    statement_timeout_s: float | None = None,
) -> int:
    """The match's new settlement generation."""
    return int(
        await conn.fetchval(
            Q.reopen_match,
            match_id,
            reopened_bets,
            *result,
            provider_event_id,
            now,
            sequence,
            voided_reason,
            timeout=statement_timeout_s,
        )
    )


async def match_external_id(conn: asyncpg.Connection, match_id: int) -> str | None:
    return await conn.fetchval(Q.match_external_id, match_id)
