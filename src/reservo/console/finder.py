"""What the console's searches share (search.py, people.py): the operator's text
and the list's cursor as query parameters, their checks, and the search page.

The operator's text is matched as typed: part of the name, any case, its ``%``
and ``_`` plain characters (repo.contains). It is only ever a query parameter."""

from __future__ import annotations

import re
from collections.abc import Awaitable, Callable
from typing import Annotated, Any

from fastapi import Query, Request
from fastapi.responses import HTMLResponse

from reservo.console.session import Session
from reservo.console.web import render, render_refused
from reservo.core.http.pagination import decode_cursor, malformed_cursor
from reservo.core.kernel.errors import DomainError, validation_error

PAGE = 25
MAX_TEXT = 100
# Longer than a cursor of the longest name (200 characters, up to 4 bytes each).
MAX_CURSOR = 2000
# The searched text as typed ("" shows the form alone).
Text = Annotated[str, Query(max_length=MAX_TEXT)]
Cursor = Annotated[str | None, Query(max_length=MAX_CURSOR)]
# PostgreSQL text holds no NUL, and no name holds a control character: refused
# before the query (a NUL would be a 500 from the driver).
_CONTROL = re.compile(r"[\x00-\x1f\x7f]")

# A page of what a search found, and the cursor of the next page (None on the last).
Found = tuple[list[Any], str | None]


def searched(q: str) -> str:
    """The text to search for: ``q`` without surrounding blanks; 422 for a
    control character."""
    if _CONTROL.search(q):
        raise validation_error(
            "the search text holds a control character: type part of a name",
            [{"loc": ["query", "q"], "msg": "control character", "type": "value_error"}],
        )
    return q.strip()


def name_cursor(after: str | None) -> tuple[str, int]:
    """The (name, id) a name-ordered list's cursor carries, or the position
    before every row; 422 for a cursor this list did not make."""
    if after is None:
        return "", 0
    name, row_id = decode_cursor(after, str, int)
    if _CONTROL.search(name):
        raise malformed_cursor()
    return name, row_id


async def show(
    request: Request,
    session: Session,
    template: str,
    q: str,
    read: Callable[[str], Awaitable[Found]],
) -> HTMLResponse:
    """The search page: the form alone for no text, else a page of what ``read``
    found; a refused text or cursor is said on the page with its 4xx (nothing
    read)."""
    context: dict[str, Any] = {"q": q.strip(), "items": [], "next": None}
    try:
        text = searched(q)
        if text:
            context["items"], context["next"] = await read(text)
    except DomainError as err:
        return render_refused(request, template, session, err, **context)
    return render(request, template, session, error=None, **context)
