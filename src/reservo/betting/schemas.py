"""Request and response bodies of the Betting API."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from decimal import Decimal
from typing import Annotated, Any, Literal

from pydantic import (
    ConfigDict,
    Field,
    StrictBool,
    StrictInt,
    field_validator,
    model_validator,
    with_config,
)
from pydantic.json_schema import WithJsonSchema

from reservo.betting.domain import MARKETS, MAX_SELECTIONS, Fixture
from reservo.core.http.schemas import ApiModel, Id, Instant

Market = Literal["1X2", "TOTALS_2_5", "BTTS"]
# Decimal strings with at most two decimals (at most four digits before the
# point), between 1.01 and 1000: the pattern says both (_odds_ok repeats the
# range in numbers, for the odds of a market).
ODDS_PATTERN = (
    r"^(?:0{0,3}1\.(?:0[1-9]|[1-9][0-9]?)"
    r"|(?:0{0,3}[2-9]|0{0,2}[1-9][0-9]|0?[1-9][0-9]{2})(?:\.[0-9]{1,2})?"
    r"|1000(?:\.0{1,2})?)$"
)
OddsStr = Annotated[str, Field(pattern=ODDS_PATTERN, examples=["1.85"])]
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


_ODDS = {"type": "string", "pattern": ODDS_PATTERN, "examples": ["1.85"]}
# What _complete_markets takes, for the document: at least one market, each
# with exactly its picks.
_ODDS_SCHEMA = {
    "type": "object",
    "minProperties": 1,
    "additionalProperties": False,
    "properties": {
        market: {
            "type": "object",
            "properties": {pick: _ODDS for pick in picks},
            "required": list(picks),
            "additionalProperties": False,
        }
        for market, picks in MARKETS.items()
    },
    "description": "At least one market; each with exactly its picks, odds 1.01-1000",
    "examples": [{"1X2": {"HOME": "1.80", "DRAW": "3.40", "AWAY": "4.20"}}],
}
OddsIn = Annotated[
    dict[Market, dict[str, OddsStr]], WithJsonSchema(_ODDS_SCHEMA, mode="validation")
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

    # _something's rule, for the document: odds, suspended or both, not null.
    model_config = ConfigDict(
        json_schema_extra={
            "anyOf": [
                {"required": [name], "properties": {name: {"not": {"type": "null"}}}}
                for name in ("odds", "suspended")
            ]
        }
    )

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
    # None for a result an admin set (a resettle or a void): no provider sent it.
    provider_event_id: str | None


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
    # Which picks each market has (the validator's rule, for the document).
    model_config = ConfigDict(
        json_schema_extra={
            "oneOf": [
                {
                    "properties": {"market": {"const": market}, "pick": {"enum": list(picks)}},
                    "required": ["market", "pick"],
                }
                for market, picks in MARKETS.items()
            ]
        }
    )

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


def _scores_when_finished(status: str, home: int | None, away: int | None) -> None:
    if status == "FINISHED" and (home is None or away is None):
        raise ValueError("a FINISHED result needs homeScore and awayScore")


class ResultIn(ApiModel):
    """The results provider's webhook body. ``correction: true`` corrects the
    match's result (it is settled again under this one); ``sequence``, the
    provider's order of its corrections: one not after the match's last
    correction is stale (parked as a dead letter, the match stays as it is)."""

    match_external_id: Text
    home_score: Score | None = None
    away_score: Score | None = None
    status: Literal["FINISHED", "CANCELLED"]
    provider_event_id: Text
    correction: StrictBool = False
    sequence: Annotated[StrictInt, Field(ge=0, le=2**62)] | None = None

    @model_validator(mode="after")
    def _scores(self) -> ResultIn:
        _scores_when_finished(self.status, self.home_score, self.away_score)
        return self

    def wire(self) -> dict[str, object]:
        """The result as stored and published: an ordinary result's as it always
        was, a correction's with ``correction`` and ``sequence``."""
        out = super().wire()
        if not self.correction:
            del out["correction"], out["sequence"]
        return out


class CorrectedResult(ApiModel):
    status: Literal["FINISHED", "CANCELLED"]
    home_score: Score | None = None
    away_score: Score | None = None

    @model_validator(mode="after")
    def _scores(self) -> CorrectedResult:
        _scores_when_finished(self.status, self.home_score, self.away_score)
        return self


class ResettleIn(ApiModel):
    """The match's corrected result: the match is settled again under it."""

    result: CorrectedResult


class VoidIn(ApiModel):
    """Why the match is voided (kept on the match and in its event)."""

    reason: Annotated[str, Field(min_length=1, max_length=500, pattern=r"^[^\x00]+$")]


class Accepted(ApiModel):
    accepted: bool


def odds_text(value: Any) -> str:
    return f"{Decimal(value):.2f}"
