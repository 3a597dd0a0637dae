"""Finding things by name: doctors by name, cars by model or city, matches by a
team's name or the external id. Each is a keyset list, 25 a page, read through a
trigram index (migration 0043), its rows linking to the page of the thing found
(a doctor's day, a car's calendar). The overview's "Find" form sends the operator
to any of them, so each is one click away from the overview."""

from __future__ import annotations

from datetime import datetime
from typing import Any, Literal
from urllib.parse import urlencode

from fastapi import APIRouter, Request
from fastapi.responses import HTMLResponse, RedirectResponse

from reservo.console import repo
from reservo.console.finder import PAGE, Cursor, Found, Text, name_cursor, show
from reservo.console.web import SignedIn, site
from reservo.core.http.pagination import page, time_cursor, time_key
from reservo.core.http.schemas import LATEST, MAX_ID

router = APIRouter(prefix="/console", include_in_schema=False)

# Where the overview's Find form sends each kind of search.
FIND: dict[str, str] = {
    "doctor": "/console/clinic/doctors",
    "car": "/console/rentals/cars",
    "match": "/console/betting/matches",
    "person": "/console/people",
}
Kind = Literal["doctor", "car", "match", "person"]


@router.get("/find", response_model=None)
async def find(
    session: SignedIn,
    what: Kind = "doctor",
    q: Text = "",
) -> RedirectResponse:
    """The overview's Find form: to the search of ``what`` (a GET, nothing changes)."""
    return RedirectResponse(f"{FIND[what]}?{urlencode({'q': q})}", status_code=303)


@router.get("/clinic/doctors", response_class=HTMLResponse)
async def doctors(
    request: Request, session: SignedIn, q: Text = "", after: Cursor = None
) -> HTMLResponse:
    """Doctors by part of the name, in name order; each opens the doctor's day
    (today in the doctor's zone)."""

    async def read(text: str) -> Found:
        position = name_cursor(after)
        async with site(request).db.connection() as conn:
            rows = await repo.find_doctors(conn, text, position, PAGE + 1)
        return page(rows, PAGE, lambda r: (r["name"], r["id"]))

    return await show(request, session, "search_doctors.html", q, read)


@router.get("/rentals/cars", response_class=HTMLResponse)
async def cars(
    request: Request, session: SignedIn, q: Text = "", after: Cursor = None
) -> HTMLResponse:
    """Cars by part of the model or of the city, in model order; each opens the
    car's calendar."""

    async def read(text: str) -> Found:
        position = name_cursor(after)
        async with site(request).db.connection() as conn:
            rows = await repo.find_cars(conn, text, position, PAGE + 1)
        return page(rows, PAGE, lambda r: (r["model"], r["id"]))

    return await show(request, session, "search_cars.html", q, read)


def _match_key(r: Any) -> tuple[int, int]:
    return time_key(r["starts_at"], r["id"])


@router.get("/betting/matches", response_class=HTMLResponse)
async def matches(
    request: Request, session: SignedIn, q: Text = "", after: Cursor = None
) -> HTMLResponse:
    """Matches by part of a team's name or of the external id, latest kick-off
    first."""

    async def read(text: str) -> Found:
        # The first page starts after every kick-off (none is at or past LATEST).
        before: tuple[datetime, int] = time_cursor(after) or (LATEST, MAX_ID)
        async with site(request).db.connection() as conn:
            rows = await repo.find_matches(conn, text, before, PAGE + 1)
        return page(rows, PAGE, _match_key)

    return await show(request, session, "search_matches.html", q, read)
