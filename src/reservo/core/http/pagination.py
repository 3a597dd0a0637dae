"""Keyset pagination shared by every list endpoint: ``?limit=N&after=CURSOR`` ->
``{items, next}``. A cursor is the sort key of the last item served, opaque to
clients (base64url of a small JSON array), so page one million costs what page
one costs: the next page starts at an index position, never at an OFFSET."""

from __future__ import annotations

import base64
import binascii
from datetime import UTC, datetime, timedelta
from typing import Annotated, Any

import orjson
from fastapi import Query

from reservo.core.http.schemas import EARLIEST, LATEST, MAX_ID
from reservo.core.kernel.errors import DomainError, issue, validation_error

DEFAULT_LIMIT, MAX_LIMIT = 50, 200
Limit = Annotated[int, Query(ge=1, le=MAX_LIMIT, description="page size (1-200)")]
After = Annotated[
    str | None,
    Query(max_length=200, description="the `next` cursor of the previous page"),
]


def encode_cursor(*key: int | str) -> str:
    return base64.urlsafe_b64encode(orjson.dumps(list(key))).decode().rstrip("=")


def decode_cursor(cursor: str, *types: type) -> tuple[Any, ...]:
    """The sort key a cursor carries, checked against ``types``; 422 when the
    cursor was not made by ``encode_cursor`` for this list."""
    try:
        raw = base64.urlsafe_b64decode(cursor + "=" * (-len(cursor) % 4))
        key = orjson.loads(raw)
    except (binascii.Error, ValueError):
        key = None
    ok = (
        isinstance(key, list)
        and len(key) == len(types)
        and all(type(v) is t for v, t in zip(key, types, strict=True))
        and all(v >= 1 for v in key if isinstance(v, int))
        and all(v <= MAX_ID for v in key if isinstance(v, int))
    )
    if not ok:
        raise malformed_cursor()
    return tuple(key)


# A time in a cursor: microseconds since 1970 (an integer survives JSON exactly).
_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)
_US = timedelta(microseconds=1)


def time_key(at: datetime, row_id: int) -> tuple[int, int]:
    """The cursor key of a list sorted on (a time, id)."""
    return (at - _EPOCH) // _US, row_id


def time_cursor(after: str | None) -> tuple[datetime, int] | None:
    """The (time, id) a ``time_key`` cursor carries; 422 for a time outside
    [EARLIEST, LATEST), which no row holds: not our cursor."""
    if after is None:
        return None
    us, row_id = decode_cursor(after, int, int)
    if not (EARLIEST - _EPOCH) // _US <= us < (LATEST - _EPOCH) // _US:
        raise malformed_cursor()
    return _EPOCH + us * _US, row_id


def malformed_cursor() -> DomainError:
    """The 422 of a cursor this list did not make."""
    return validation_error(
        "malformed cursor: pass the `next` value of the previous page unchanged",
        [issue(("query", "after"), "malformed cursor", "malformed_cursor")],
    )


def page(items: list[Any], limit: int, key: Any) -> tuple[list[Any], str | None]:
    """Callers fetch ``limit + 1`` rows; the extra one only says another page exists."""
    if len(items) <= limit:
        return items, None
    items = items[:limit]
    last = key(items[-1])
    return items, encode_cursor(*(last if isinstance(last, tuple) else (last,)))
