"""Pure betting rules (no I/O): markets, grading, accumulator settlement.

The SQL settlement (queries.sql: grade_chunk, settle_bets) implements the same
rules set-based; tests check one against the other."""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from decimal import ROUND_FLOOR, Decimal
from typing import Any

from reservo.core.db.rows import FromRow, build

MARKETS: dict[str, tuple[str, ...]] = {
    "1X2": ("HOME", "DRAW", "AWAY"),
    "TOTALS_2_5": ("OVER", "UNDER"),
    "BTTS": ("YES", "NO"),
}
MAX_SELECTIONS = 20


class BetRefused(Exception):
    def __init__(self, code: str, detail: str) -> None:
        super().__init__(detail)
        self.code, self.detail = code, detail


@dataclass(frozen=True)
class Leg:
    match_id: int
    market: str
    pick: str
    odds: Decimal


@dataclass(frozen=True)
class MatchState:
    id: int
    starts_at: datetime
    odds: Mapping[str, Mapping[str, str]]
    has_result: bool
    suspended: bool = False


@dataclass(frozen=True, slots=True)
class MatchResult:
    status: str  # FINISHED | CANCELLED
    home_score: int | None
    away_score: int | None
    provider_event_id: str  # the provider's event that brought it


@dataclass(frozen=True, slots=True)
class Fixture:
    """A match as it is offered: who plays when, at which odds, open or suspended."""

    id: int
    external_id: str
    home: str
    away: str
    starts_at: datetime
    odds: dict[str, dict[str, str]]
    suspended: bool


@dataclass(frozen=True, slots=True)
class Match(Fixture):
    result: MatchResult | None  # None until the result came
    settlement_status: str
    settled_bets: int
    # Legs still to settle: read for one match, not for the lists.
    pending_bets: int | None = None

    @classmethod
    def from_row(cls, row: Mapping[str, Any], pending_bets: int | None = None) -> Match:
        result = None
        if row["result_status"] is not None:
            result = MatchResult(
                row["result_status"], row["home_score"], row["away_score"], row["result_event_id"]
            )
        return build(cls, row, result=result, pending_bets=row.get("pending_bets", pending_bets))


@dataclass(frozen=True, slots=True)
class Selection(FromRow):
    """One leg of a placed bet and its grade."""

    match_id: int
    market: str
    pick: str
    odds: Decimal
    status: str  # PENDING | WON | LOST | VOID


@dataclass(frozen=True, slots=True)
class Bet:
    id: int
    account_id: int
    owner_id: int
    stake: int
    potential_payout: int
    status: str
    payout: int | None
    created_at: datetime
    selections: tuple[Selection, ...] = field(default=())

    @classmethod
    def from_row(cls, row: Mapping[str, Any], selections: Iterable[Selection] = ()) -> Bet:
        return build(cls, row, selections=tuple(selections))


def winning_picks(home: int, away: int) -> dict[str, str]:
    """The pick that wins each market for a final score."""
    return {
        "1X2": "HOME" if home > away else "AWAY" if away > home else "DRAW",
        "TOTALS_2_5": "OVER" if home + away > 2 else "UNDER",
        "BTTS": "YES" if home > 0 and away > 0 else "NO",
    }


def grade(market: str, pick: str, status: str, home: int | None, away: int | None) -> str:
    """A selection's status once its match has a result."""
    if status == "CANCELLED" or home is None or away is None:
        return "VOID"
    return "WON" if winning_picks(home, away)[market] == pick else "LOST"


def floor_payout(stake: int, odds: Iterable[Decimal]) -> int:
    product = Decimal(stake)
    for o in odds:
        product *= o
    return int(product.to_integral_value(rounding=ROUND_FLOOR))


def _product(odds: Iterable[Decimal]) -> tuple[int, int]:
    """The exact product of the odds as (numerator, denominator): integers, so no
    Decimal context rounds a long product (20 legs carry 40 decimals)."""
    num, den = 1, 1
    for o in odds:
        n, d = o.as_integer_ratio()
        num, den = num * n, den * d
    return num, den


def check_payout(stake: int, odds: Sequence[Decimal], max_payout: int) -> int:
    """The bet's potential payout, refused above ``max_payout``: an accumulator of
    long odds turns a stake of 1 into more than any house can pay (and, past
    bigint, into a database error)."""
    num, den = _product(odds)
    potential = stake * num // den
    if potential > max_payout:
        # The largest stake s with floor(s * num / den) <= max_payout.
        max_stake = ((max_payout + 1) * den - 1) // num
        raise BetRefused(
            "validation_error",
            f"the potential payout exceeds the maximum of {max_payout}; "
            f"at these odds the stake can be at most {max_stake}",
        )
    return potential


def settle(stake: int, legs: Sequence[tuple[str, Decimal]]) -> tuple[str, int | None]:
    """A bet's status and payout from its legs' (status, odds).

    Any LOST leg loses the bet at once; otherwise it waits while a leg is
    PENDING; VOID legs count 1.00; all VOID -> VOID (stake back); else WON."""
    statuses = [s for s, _ in legs]
    if "LOST" in statuses:
        return "LOST", 0
    if "PENDING" in statuses:
        return "PENDING", None
    if all(s == "VOID" for s in statuses):
        return "VOID", stake
    return "WON", floor_payout(stake, (o for s, o in legs if s == "WON"))


def check_bet(legs: Sequence[Leg], matches: Mapping[int, MatchState], now: datetime) -> None:
    """Refuse a bet on a started or suspended match, or at odds the match no
    longer offers. ``matches`` must be read under the row lock a change of odds or
    suspension waits for (queries.sql: matches_for_bet), so the check and the bet
    commit before such a change or see it."""
    for leg in legs:
        match = matches[leg.match_id]
        if match.has_result or match.starts_at <= now:
            raise BetRefused("match_closed", f"match {leg.match_id} has already started")
        if match.suspended:
            raise BetRefused("market_suspended", f"betting on match {leg.match_id} is suspended")
        current = match.odds.get(leg.market, {}).get(leg.pick)
        if current is None or Decimal(current) != leg.odds:
            now_at = current or "unavailable"
            raise BetRefused(
                "odds_changed", f"match {leg.match_id} {leg.market}/{leg.pick} is now at {now_at}"
            )


def check_result(status: str, starts_at: datetime, now: datetime) -> None:
    """A match is FINISHED only once it started: a final result posted before
    kick-off would settle (and pay) bets on a game not yet played.

    CANCELLED is accepted whenever it comes: a match called off before kick-off is
    exactly when it is cancelled, and voiding its bets (stakes back) is the only way
    their money comes back; refusing it would keep it staked on a game that never
    takes place."""
    if status != "CANCELLED" and starts_at > now:
        raise BetRefused(
            "match_not_started", f"the match starts at {starts_at.isoformat()}; no result yet"
        )


# A reported result: (status, homeScore, awayScore).
Reported = tuple[str, int | None, int | None]


def same_result(first: Reported, again: Reported) -> bool:
    """Whether a second report of a match's result says what the first said (its
    provider event aside): then it changes nothing. A CANCELLED match has no
    score: the scores sent with it grade no bet, so they are not compared."""
    if first[0] != again[0]:
        return False
    return first[0] == "CANCELLED" or first[1:] == again[1:]


def check_resettle(
    current: tuple[str | None, int | None, int | None],
    new: Reported,
    current_sequence: int | None,
    sequence: int | None,
    *,
    void: bool,
) -> None:
    """Whether a match with the ``current`` result may be settled again under
    ``new``. A void (CANCELLED by an admin) may come at any time, once; a
    correction needs a result to correct, must differ from it, and must come
    after the correction the match has (the provider's ``sequence``: two
    corrections racing settle in the order it sent them)."""
    if void:
        if current[0] == "CANCELLED":
            raise BetRefused("already_void", "the match is already void")
        return
    status, home, away = current
    if status is None:
        raise BetRefused("not_settled", "the match has no result yet: nothing to correct")
    if sequence is not None and current_sequence is not None and sequence <= current_sequence:
        raise BetRefused(
            "stale_correction",
            f"correction {sequence} is not after the match's correction {current_sequence}",
        )
    if same_result((status, home, away), new):
        raise BetRefused("same_result", "the match already has this result")
