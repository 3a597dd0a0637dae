"""Base model for the HTTP contract: camelCase on the wire, strict input."""

from __future__ import annotations

from datetime import UTC, date, datetime
from typing import Annotated, Any

from pydantic import AfterValidator, AwareDatetime, BaseModel, ConfigDict, Field, model_validator
from pydantic.alias_generators import to_camel

# The one accepted range of every instant and date a client sends (jobs, matches,
# bookings, schedules, queries). Nothing reservo serves needs a time outside this
# century, and times far outside it break on the way: year 1 minus an offset is
# year 0, which Python cannot represent, so a stored row would fail every later
# read. Refusing them at the edge (422) keeps such rows out for good; the
# database repeats the rule as CHECK constraints.
EARLIEST = datetime(2000, 1, 1, tzinfo=UTC)
LATEST = datetime(2100, 1, 1, tzinfo=UTC)  # exclusive
EARLIEST_DAY, LATEST_DAY = EARLIEST.date(), date(2099, 12, 31)


def _in_range(value: datetime) -> datetime:
    if not EARLIEST <= value < LATEST:
        raise ValueError(
            f"instant out of the accepted range [{EARLIEST.isoformat()}, {LATEST.isoformat()})"
        )
    return value


# An instant with an explicit UTC offset, inside the accepted range.
Instant = Annotated[AwareDatetime, AfterValidator(_in_range)]
# A calendar date inside the accepted range.
Day = Annotated[date, Field(ge=EARLIEST_DAY, le=LATEST_DAY)]


def _unstorable(value: Any) -> str | None:
    """Why a JSON value cannot be stored (PostgreSQL text has no NUL; our JSON codec
    and PostgreSQL bigint stop at 64 bits), or None."""
    if isinstance(value, str):
        return "strings may not contain NUL characters" if "\x00" in value else None
    if isinstance(value, bool):
        return None
    if isinstance(value, int):
        return None if -(2**63) <= value < 2**64 else "integers must fit in 64 bits"
    if isinstance(value, dict):
        for k, v in value.items():
            reason = _unstorable(k) or _unstorable(v)
            if reason:
                return reason
    if isinstance(value, list | tuple):
        for v in value:
            reason = _unstorable(v)
            if reason:
                return reason
    return None


class ApiModel(BaseModel):
    model_config = ConfigDict(
        alias_generator=to_camel,
        populate_by_name=True,
        extra="forbid",
        frozen=True,
        # Money, ids and counts are integers: "10" or 10.0 is refused, not coerced.
        strict=False,
    )

    @model_validator(mode="before")
    @classmethod
    def _no_nul(cls, data: Any) -> Any:
        # Refuse what the database could not store here, as bad input (422), not 500.
        reason = _unstorable(data)
        if reason:
            raise ValueError(reason)
        return data

    def wire(self) -> dict[str, object]:
        return self.model_dump(mode="json", by_alias=True)
