"""Base model for the HTTP contract: camelCase on the wire, strict input."""

from __future__ import annotations

import json
import math
import re
from datetime import UTC, date, datetime
from typing import Annotated, Any

import orjson
from pydantic import (
    AfterValidator,
    AwareDatetime,
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
    StrictInt,
    model_validator,
)
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
# Every id is a PostgreSQL bigint: a larger one names nothing (422, not a 500).
MAX_ID = 2**63 - 1
Id = Annotated[StrictInt, Field(ge=1, le=MAX_ID)]


# The only spellings a client may send (bodies and query strings alike): an
# instant is RFC 3339 with its offset (Z or +hh:mm), a date is YYYY-MM-DD. The
# parser behind them is lenient (a Unix number or a digit string became an
# instant, a midnight datetime a date), so the text is held to these first.
_RFC3339 = re.compile(
    r"[0-9]{4}-[0-9]{2}-[0-9]{2}[Tt][0-9]{2}:[0-9]{2}:[0-9]{2}(?:\.[0-9]{1,9})?(?:[Zz]|[+-][0-9]{2}:[0-9]{2})",
    re.ASCII,
)
_ISO_DAY = re.compile(r"[0-9]{4}-[0-9]{2}-[0-9]{2}", re.ASCII)


def _rfc3339(value: Any) -> Any:
    # A datetime object comes from code, not from a client: it is taken as is.
    if isinstance(value, datetime):
        return value
    if not isinstance(value, str) or _RFC3339.fullmatch(value) is None:
        raise ValueError("an instant is RFC 3339 with an offset, e.g. 2026-01-25T08:00:00+07:00")
    return value


def _iso_day(value: Any) -> Any:
    if isinstance(value, date) and not isinstance(value, datetime):
        return value
    if not isinstance(value, str) or _ISO_DAY.fullmatch(value) is None:
        raise ValueError("a date is YYYY-MM-DD")
    return value


def _in_range(value: datetime) -> datetime:
    if not EARLIEST <= value < LATEST:
        raise ValueError(
            f"instant out of the accepted range [{EARLIEST.isoformat()}, {LATEST.isoformat()})"
        )
    return value


def _day_in_range(value: date) -> date:
    if not EARLIEST_DAY <= value <= LATEST_DAY:
        raise ValueError(
            f"date out of the accepted range [{EARLIEST_DAY.isoformat()}, {LATEST_DAY.isoformat()}]"
        )
    return value


# An instant with an explicit UTC offset, inside the accepted range.
Instant = Annotated[AwareDatetime, BeforeValidator(_rfc3339), AfterValidator(_in_range)]
# A calendar date inside the accepted range. Validators, not Field bounds: they
# stay in force where the type is nested in Query(...).
Day = Annotated[date, BeforeValidator(_iso_day), AfterValidator(_day_in_range)]


# Deepest JSON nesting a request may carry (objects and arrays, the body itself
# counting as level 1). Nothing reservo accepts needs more than a few levels;
# orjson refuses to write more than 254, which a stored payload must survive.
MAX_DEPTH = 32


# The integers a JSON value may hold: what our JSON codec (orjson) writes back,
# signed or unsigned 64 bits. A larger one would be stored as text nobody reads
# back as a number, or not at all.
MIN_INT, MAX_INT = -(2**63), 2**64 - 1


def _bad_string(text: str) -> str | None:
    if "\x00" in text:
        return "strings may not contain NUL characters"
    if not text.isascii():
        try:
            text.encode("utf-8")
        except UnicodeEncodeError:  # a lone UTF-16 surrogate ("\\ud800")
            return "strings may not contain lone UTF-16 surrogates"
    return None


def _unstorable(value: Any) -> str | None:
    """Why a JSON value cannot be stored, or None: PostgreSQL text has no NUL and
    no lone surrogate (not UTF-8); our JSON codec and PostgreSQL bigint stop at
    64 bits; NaN and Infinity are not JSON; nesting is bounded. Walks with its
    own stack (no recursion), so no input depth can exhaust the interpreter's.
    Object keys are checked as strings too."""
    stack: list[tuple[Any, int]] = [(value, 0)]
    while stack:
        item, depth = stack.pop()
        if isinstance(item, str):
            reason = _bad_string(item)
            if reason:
                return reason
        elif isinstance(item, bool):
            continue
        elif isinstance(item, int):
            if not MIN_INT <= item <= MAX_INT:
                return "integers must fit in 64 bits"
        elif isinstance(item, float):
            if not math.isfinite(item):
                return "numbers must be finite (NaN and Infinity are not JSON)"
        elif isinstance(item, dict | list | tuple):
            if depth >= MAX_DEPTH:
                return f"JSON may nest at most {MAX_DEPTH} levels"
            children = item.items() if isinstance(item, dict) else ((v,) for v in item)
            for pair in children:
                stack.extend((child, depth + 1) for child in pair)
    return None


class JsonRefused(ValueError):
    """A request body that is not JSON reservo accepts (the message says why)."""


def read_json(raw: bytes) -> Any:
    """A JSON document under the intake rules every body follows (docs/OPERATIONS.md,
    "Input limits"), or JsonRefused: UTF-8 only, no lone surrogate, no NaN or
    Infinity, no NUL, integers within 64 bits, at most MAX_DEPTH levels. The one
    reader of every JSON intake (core/http/glue.py's middleware, the hot routes), so a
    free-form field (a job's payload) holds to the same rules as a typed one."""
    try:
        value = orjson.loads(raw)
    except orjson.JSONDecodeError as exc:
        # orjson refuses lone surrogates, NaN/Infinity and invalid UTF-8 itself;
        # the lenient reading names the rule, when it is one.
        raise JsonRefused(_lenient_refusal(raw) or f"the body is not valid JSON: {exc}") from None
    reason = _unstorable(value)
    if reason is None and _has_wide_float(value):
        # orjson reads an integer literal past 64 bits as a float: the exact
        # reading decides whether it was one (then refused) or a real 1e30.
        reason = _lenient_refusal(raw)
    if reason is not None:
        raise JsonRefused(reason)
    return value


def _lenient_refusal(raw: bytes) -> str | None:
    """The rule the standard library's reading of ``raw`` breaks (it takes NaN,
    lone surrogates and integers of any size), or None (also when it cannot
    read it either)."""
    try:
        return _unstorable(json.loads(raw))
    except (ValueError, RecursionError):  # not JSON at all, or too many digits
        return None


def _has_wide_float(value: Any) -> bool:
    stack = [value]
    while stack:
        item = stack.pop()
        if isinstance(item, float):
            # Rounded: -(2**63) - 1 reads as exactly -(2**63), a float.
            if abs(item) >= 2**63:
                return True
        elif isinstance(item, dict):
            stack.extend(item.values())
        elif isinstance(item, list):
            stack.extend(item)
    return False


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
