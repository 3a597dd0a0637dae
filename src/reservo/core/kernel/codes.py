"""The form a module declares its error codes in (its ``errors.py``: ``ERRORS``).

Codes are listed under the HTTP status they answer with, so a table reads as
"these are not found, these conflict" and states each status once; the result
is the code -> status mapping ``core.kernel.errors.register`` takes."""

from __future__ import annotations

from collections.abc import Iterable
from http import HTTPStatus


def by_status(
    *,
    not_found: Iterable[str] = (),
    conflict: Iterable[str] = (),
    unprocessable: Iterable[str] = (),
    unavailable: Iterable[str] = (),
) -> dict[str, int]:
    """code -> HTTP status: 404, 409, 422 and 503 respectively."""
    groups = {
        HTTPStatus.NOT_FOUND: not_found,
        HTTPStatus.CONFLICT: conflict,
        HTTPStatus.UNPROCESSABLE_ENTITY: unprocessable,
        HTTPStatus.SERVICE_UNAVAILABLE: unavailable,
    }
    table: dict[str, int] = {}
    for status, codes in groups.items():
        for code in codes:
            if code in table:
                raise ValueError(f"error code {code} listed under two statuses")
            table[code] = status.value
    return table
