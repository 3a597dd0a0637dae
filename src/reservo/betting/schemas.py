"""Request and response bodies of the Betting API."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from decimal import Decimal
from typing import Annotated, Any, Literal

from pydantic import (
    Field,
    StrictBool,
    StrictInt,
    field_validator,
    model_validator,
    with_config,
)

from reservo.betting.domain import MARKETS, MAX_SELECTIONS, Fixture
from reservo.core.http.schemas import ApiModel, Id, Instant

Market = Literal["1X2", "TOTALS_2_5", "BTTS"]
# Decimal strings with at most two decimals, between 1.01 and 1000.
OddsStr = Annotated[str, Field(pattern=r"^[0-9]{1,4}(\.[0-9]{1,2})?$", examples=["1.85"])]
Score = Annotated[StrictInt, Field(ge=0, le=1000)]
# PostgreSQL text cannot hold NUL: refuse it here (422) rather than fail in the database.
Text = Annotated[str, Field(min_length=1, max_length=200, pattern=r"^[^\x00]+$")]


def _odds_ok(value: str) -> str:
    if not Decimal("1.01") <= Decimal(value) <= Decimal("1000"):
        raise ValueError("odds must be between 1.01 and 1000")
    return value


def _complete_markets(v: dict[str, dict[str, str]]) -> dict[str, dict[str, str]]:
    """Odds are whole markets: every pick of each market offered, each in range."""
    if not v:
        raise ValueError("at least one market")
    for market, picks in v.items():
        if set(picks) != set(MARKETS[market]):
            raise ValueError(f"{market} needs exactly the picks {list(MARKETS[market])}")
        for o in picks.values():
            _odds_ok(o)
    return v


OddsIn = Annotated[
    dict[Market, dict[str, OddsStr]],
    Field(examples=[{"1X2": {"HOME": "1.80", "DRAW": "3.40", "AWAY": "4.20"}}]),
]


class MatchIn(ApiModel):
    external_id: Text
    home: Text
    away: Text
    starts_at: Instant
    odds: OddsIn

    @field_validator("odds")
    @classmethod
    def _odds(cls, v: dict[str, dict[str, str]]) -> dict[str, dict[str, str]]:
        return _complete_markets(v)


class MatchPatch(ApiModel):
    """Change what a match offers before kick-off. ``odds`` replaces the match's
    odds as a whole (complete markets, as when it was created); ``suspended: true``
    refuses bets on it (409 market_suspended) until ``suspended: false``. Bets
    already placed keep the odds they were placed at."""

    odds: OddsIn | None = None
    suspended: StrictBool | None = None

    @field_validator("odds")
    @classmethod
    def _odds(cls, v: dict[str, dict[str, str]] | None) -> dict[str, dict[str, str]] | None:
        return None if v is None else _complete_markets(v)

    @model_validator(mode="after")
    def _something(self) -> MatchPatch:
        if self.odds is None and self.suspended is None:
            raise ValueError("give odds, suspended or both")
        return self


class SettlementOut(ApiModel):
    status: str
    pending_bets: int
    settled_bets: int


class ResultOut(ApiModel):
    status: str
    home_score: int | None
    away_score: int | None
    provider_event_id: str


# What a match and a list's summary of it both show: the fixture, its fields in
# camelCase, and its result. Only ever answered (never parsed), so it is the
# domain's Fixture rather than a model restating it. Never named in the OpenAPI
# document: only its two subclasses are.
@with_config(ApiModel.model_config)
@dataclass(frozen=True)
class _MatchFields(Fixture):
    result: ResultOut | None


@dataclass(frozen=True)
class MatchOut(_MatchFields):
    suspended: Annotated[bool, Field(description="bets on it are refused (409 market_suspended)")]
    settlement: SettlementOut


class SettlementSummaryOut(ApiModel):
    status: str
    settled_bets: int


@dataclass(frozen=True)
class MatchSummaryOut(_MatchFields):
    """A match as lists show it: the match without ``settlement.pendingBets``,
    which counts the match's open bets (GET /api/matches/{matchId} has it); counting
    them for every match of a page would cost a page what its matches' bets cost."""

    settlement: SettlementSummaryOut


class MatchPage(ApiModel):
    items: list[MatchSummaryOut]
    next: str | None = Field(description="cursor of the next page (`after`); null on the last")


class SelectionIn(ApiModel):
    match_id: Id
    market: Market
    pick: Annotated[str, Field(min_length=1, max_length=10)]
    odds: OddsStr

    @model_validator(mode="after")
    def _pick_in_market(self) -> SelectionIn:
        if self.pick not in MARKETS[self.market]:
            raise ValueError(f"pick for {self.market} is one of {list(MARKETS[self.market])}")
        _odds_ok(self.odds)
        return self


class BetIn(ApiModel):
    account_id: Id
    stake: Annotated[StrictInt, Field(ge=1, le=10**12)]
    selections: Annotated[list[SelectionIn], Field(min_length=1, max_length=MAX_SELECTIONS)]

    @field_validator("selections")
    @classmethod
    def _distinct_matches(cls, v: list[SelectionIn]) -> list[SelectionIn]:
        if len({s.match_id for s in v}) != len(v):
            raise ValueError("selections must be on distinct matches")
        return v


class SelectionOut(ApiModel):
    match_id: int
    market: str
    pick: str
    odds: str
    status: str


class BetOut(ApiModel):
    id: int
    account_id: int
    stake: int
    status: str
    potential_payout: int
    payout: int | None
    selections: list[SelectionOut]
    created_at: datetime


class BetPage(ApiModel):
    items: list[BetOut]
    next: str | None = Field(description="cursor of the next page (`after`); null on the last")


class ResultIn(ApiModel):
    """The results provider's webhook body."""

    match_external_id: Text
    home_score: Score | None = None
    away_score: Score | None = None
    status: Literal["FINISHED", "CANCELLED"]
    provider_event_id: Text

    @model_validator(mode="after")
    def _scores_when_finished(self) -> ResultIn:
        if self.status == "FINISHED" and (self.home_score is None or self.away_score is None):
            raise ValueError("a FINISHED result needs homeScore and awayScore")
        return self


class Accepted(ApiModel):
    accepted: bool


def odds_text(value: Any) -> str:
    return f"{Decimal(value):.2f}"
