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
    GetJsonSchemaHandler,
    StrictInt,
    ValidationInfo,
    model_validator,
)
from pydantic.alias_generators import to_camel
from pydantic.json_schema import JsonSchemaValue, WithJsonSchema
from pydantic_core import CoreSchema

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


_DAY_OF_MONTH = "(?:0[1-9]|[12][0-9]|3[01])"


def _instant_pattern() -> str:
    """The instants of [EARLIEST, LATEST) as text, for the document (JSON Schema
    has no bounds for a date-time): years 2001-2098 whole; 2000 but its first
    day, whose time is in range with a `Z`, a negative or a zero offset; 2099 but
    its last day, in range with a `Z`, a positive or a zero offset. An instant of
    2000-01-01 with a positive offset still in 2000 in UTC (or of 2099-12-31 with a
    negative one) is taken too, as is one whose text names the day before the
    range or after it but whose UTC instant is inside: the pattern leaves those
    few out, the description gives the exact rule."""
    # Fields in their ranges (a generator drawing from the pattern then makes
    # few texts the date-time format refuses): only a 29-31 a month lacks is.
    time = "[Tt](?:[01][0-9]|2[0-3]):[0-5][0-9]:[0-5][0-9](?:\\.[0-9]{1,9})?"
    hhmm = "(?:[01][0-9]|2[0-3]):[0-5][0-9]"
    day = f"(?:0[1-9]|1[0-2])-{_DAY_OF_MONTH}"
    inner = (
        f"20(?:0[1-9]|[1-8][0-9]|9[0-8])-{day}"
        f"|2000-(?:(?:0[2-9]|1[0-2])-{_DAY_OF_MONTH}|01-(?:0[2-9]|[12][0-9]|3[01]))"
        f"|2099-(?:(?:0[1-9]|1[01])-{_DAY_OF_MONTH}|12-(?:0[1-9]|[12][0-9]|30))"
    )
    return (
        f"^(?:(?:{inner}){time}(?:[Zz]|[+-]{hhmm})"
        f"|2000-01-01{time}(?:[Zz]|-{hhmm}|\\+00:00)"
        f"|2099-12-31{time}(?:[Zz]|\\+{hhmm}|-00:00))$"
    )


_INSTANT_SCHEMA = {
    "type": "string",
    "format": "date-time",
    "pattern": _instant_pattern(),
    "description": f"RFC 3339 with an offset, in [{EARLIEST.isoformat()}, {LATEST.isoformat()})",
}
# A date of [2000, 2100) as text, each field in its range.
DAY_PATTERN = f"^20[0-9]{{2}}-(?:0[1-9]|1[0-2])-{_DAY_OF_MONTH}$"
_DAY_SCHEMA = {
    "type": "string",
    "format": "date",
    "pattern": DAY_PATTERN,
    "description": f"YYYY-MM-DD, in [{EARLIEST_DAY.isoformat()}, {LATEST_DAY.isoformat()}]",
}

# An instant with an explicit UTC offset, inside the accepted range.
Instant = Annotated[
    AwareDatetime,
    BeforeValidator(_rfc3339),
    AfterValidator(_in_range),
    WithJsonSchema(_INSTANT_SCHEMA, mode="validation"),
]
# A calendar date inside the accepted range. Validators, not Field bounds: they
# stay in force where the type is nested in Query(...).
Day = Annotated[
    date,
    BeforeValidator(_iso_day),
    AfterValidator(_day_in_range),
    WithJsonSchema(_DAY_SCHEMA, mode="validation"),
]


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
    return _walk(value)[0]


def _walk(value: Any) -> tuple[str | None, int]:
    """``_unstorable``'s reason, and how many members the value's objects hold
    together (what ``_repeats_a_key`` compares with the keys written). The
    exact JSON types are told apart by ``type()`` before the ``isinstance``
    chain (subclasses, from Python callers), and children are pushed one by
    one: every body is walked, and the generic form cost twice as much. The
    order of the walk, hence the reason named first, is the same either way."""
    members = 0
    stack: list[tuple[Any, int]] = [(value, 0)]
    pop, push = stack.pop, stack.append
    while stack:
        item, depth = pop()
        kind = type(item)
        if kind is str:
            if "\x00" in item or not item.isascii():
                reason = _bad_string(item)
                if reason:
                    return reason, members
            continue
        if kind is int:
            if not MIN_INT <= item <= MAX_INT:
                return "integers must fit in 64 bits", members
            continue
        if kind is not dict and kind is not list:
            reason = _scalar(item)
            if reason is _CONTAINER:
                pass
            elif reason:
                return reason, members
            else:
                continue
        if depth >= MAX_DEPTH:
            return f"JSON may nest at most {MAX_DEPTH} levels", members
        depth += 1
        if isinstance(item, dict):
            members += len(item)
            for key, child in item.items():
                push((key, depth))
                push((child, depth))
        else:
            for child in item:
                push((child, depth))
    return None, members


_CONTAINER = "container"


def _scalar(item: Any) -> str | None:
    """``_walk``'s check of anything but an exact str, int, dict or list: its
    reason, None when it is fine, ``_CONTAINER`` for a dict, list or tuple."""
    if isinstance(item, str):
        return _bad_string(item)
    if isinstance(item, bool):
        return None
    if isinstance(item, int):
        return None if MIN_INT <= item <= MAX_INT else "integers must fit in 64 bits"
    if isinstance(item, float):
        if not math.isfinite(item):
            return "numbers must be finite (NaN and Infinity are not JSON)"
        return None
    if isinstance(item, dict | list | tuple):
        return _CONTAINER
    return None


class JsonRefused(ValueError):
    """A request body that is not JSON reservo accepts (the message says why)."""


class DuplicateKey(JsonRefused):
    """A JSON object that names one key twice. Parsers disagree on which value
    counts (ours, orjson, keeps the last; others the first, or refuse), so a
    body that reads as 1 to a proxy, a signature check or a log may read as
    100000000 here: such a body is refused, never guessed."""

    def __init__(self, key: str) -> None:
        super().__init__(f"the key {key!r} appears more than once in one object")
        self.key = key


def read_json(raw: bytes) -> Any:
    """A JSON document under the intake rules every body follows (docs/OPERATIONS.md,
    "Input limits"), or JsonRefused: UTF-8 only, no lone surrogate, no NaN or
    Infinity, no NUL, integers within 64 bits, at most MAX_DEPTH levels, no key
    twice in one object (DuplicateKey). The one reader of every JSON intake
    (core/http/json_intake.py, the hot routes, the signed webhooks), so a
    free-form field (a job's payload) holds to the same rules as a typed one."""
    try:
        value = orjson.loads(raw)
    except orjson.JSONDecodeError as exc:
        # orjson refuses lone surrogates, NaN/Infinity and invalid UTF-8 itself;
        # the lenient reading names the rule, when it is one.
        raise JsonRefused(_lenient_refusal(raw) or f"the body is not valid JSON: {exc}") from None
    reason, members = _walk(value)
    if reason is None and _has_wide_float(value):
        # orjson reads an integer literal past 64 bits as a float: the exact
        # reading decides whether it was one (then refused) or a real 1e30.
        reason = _lenient_refusal(raw)
    if reason is not None:
        raise JsonRefused(reason)
    if _may_repeat_a_key(raw, members):
        _refuse_repeated_keys(raw)
    return value


# The end of a key: its closing quote, blanks, the colon. Outside strings a colon
# only ever follows a key; inside one it may follow an escaped quote too.
_KEY_END = re.compile(rb'"[ \t\r\n]*:')


def _may_repeat_a_key(raw: bytes, members: int) -> bool:
    """False when no object of ``raw`` can name a key twice: parsed objects
    hold ``members`` members, one per distinct key, and ``raw`` writes at most
    as many keys as it has key ends. Equal counts (every body without a key
    twice and without ``"\\":`` in a string) settle it in one scan of the
    bytes; orjson offers no hook that would see the keys themselves."""
    return members > 0 and len(_KEY_END.findall(raw)) != members


def _refuse_repeated_keys(raw: bytes) -> None:
    """Reads ``raw`` again, seeing every key of every object (the standard
    library's reader, whose hook gets each object's pairs in order): raises
    DuplicateKey at the first key an object names twice. ``raw`` was read by
    orjson and held to the rules already, so this reading cannot fail
    otherwise, and its depth is bounded."""
    json.loads(raw, object_pairs_hook=_distinct)


def _distinct(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    obj = dict(pairs)
    if len(obj) != len(pairs):
        seen: set[str] = set()
        for key, _ in pairs:
            if key in seen:
                raise DuplicateKey(key)
            seen.add(key)
    return obj


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


# A string with no NUL, as JSON Schema says it; and what makes a string schema
# narrower already (a pattern, a format, a fixed set of values).
NO_NUL = "^[^\\u0000]*$"
_FIXED = frozenset(("pattern", "format", "enum", "const"))

# A validation context key: the root of a body ``read_json`` has walked already
# (a hot route's, core/http/hotroute.py), whose second walk ApiModel skips.
WALKED = "reservo.walked"


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
    def _no_nul(cls, data: Any, info: ValidationInfo) -> Any:
        # Refuse what the database could not store here, as bad input (422), not 500.
        # Only the very object read_json walked is skipped: a nested model, or
        # anything a validator built, is walked here as before.
        context = info.context
        if context is not None and context.get(WALKED) is data:
            return data
        reason = _unstorable(data)
        if reason:
            raise ValueError(reason)
        return data

    @classmethod
    def __get_pydantic_json_schema__(
        cls, core_schema: CoreSchema, handler: GetJsonSchemaHandler
    ) -> JsonSchemaValue:
        """The model's schema, each free string property saying it holds no NUL
        (what ``_no_nul`` refuses, 422): a client, or a fuzzer, reading the
        document would otherwise send one."""
        schema = handler(core_schema)
        for prop in handler.resolve_ref_schema(schema).get("properties", {}).values():
            for branch in (prop, *prop.get("anyOf", ()), prop.get("items") or {}):
                if branch.get("type") == "string" and not _FIXED.intersection(branch):
                    branch["pattern"] = NO_NUL
        return schema

    def wire(self) -> dict[str, object]:
        return self.model_dump(mode="json", by_alias=True)
