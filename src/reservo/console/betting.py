"""The betting pages: matches of one status with their settlement's state and
progress, and a result posted by hand for a match whose provider failed.

A posted result takes the webhook's own path (``ResultIntake.post_by_hand``:
the same refusals, then Kafka or the fallback table, then the settlement
consumer). Its ``providerEventId`` is derived from the match and the result, so
a second post of the same result (a double click, a reload) is the same event
and the settlement's inbox drops it: bets are settled and paid once."""

from __future__ import annotations

from datetime import datetime
from typing import Annotated, Any, Literal

from fastapi import APIRouter, Form, Query, Request
from fastapi.responses import HTMLResponse, RedirectResponse
from pydantic import ValidationError

from reservo.betting import BettingService, Match, ResultIn, ResultIntake
from reservo.console.figures import Figures, Settling
from reservo.console.web import SignedIn, Verified, render, site
from reservo.core.http.pagination import page, time_cursor, time_key
from reservo.core.kernel.errors import DomainError

router = APIRouter(prefix="/console", include_in_schema=False)
PAGE = 25
STATUSES = ("STARTED", "UPCOMING", "SETTLED")
MatchStatus = Literal["STARTED", "UPCOMING", "SETTLED"]


def _betting(request: Request) -> BettingService:
    s: BettingService = request.app.state.betting
    return s


def _key(m: Match) -> tuple[int, int]:
    return time_key(m.starts_at, m.id)


def manual_event_id(external_id: str, result: ResultIn) -> str:
    """The same match and result give the same id, whoever posts it and however
    often: the settlement's inbox (keyed on it) takes it once."""
    scores = "" if result.status == "CANCELLED" else f":{result.home_score}-{result.away_score}"
    return f"console:{external_id}:{result.status}{scores}"


def _score(field: str) -> int | str | None:
    """A form's number as the provider's JSON would carry it (anything else is
    left for ResultIn to refuse)."""
    return int(field) if field.isdecimal() else (field or None)


async def _matches(
    request: Request, status: str, cursor: tuple[datetime, int] | None
) -> tuple[list[Match], str | None, dict[int, Settling]]:
    """A page of matches of ``status``, its next cursor, and the settling ones' progress."""
    rows = await _betting(request).list_matches(status, cursor, PAGE + 1)
    matches, nxt = page(rows, PAGE, _key)
    figures: Figures = request.app.state.console_figures
    pending = await figures.pending_legs(
        [m.id for m in matches if m.settlement_status == "SETTLING"]
    )
    progress = {
        m.id: Settling(m.id, m.home, m.away, m.settled_bets, n, None)
        for m in matches
        if (n := pending.get(m.id)) is not None
    }
    return matches, nxt, progress


async def _page(
    request: Request, session: Any, status: str, after: str | None, **extra: Any
) -> HTMLResponse:
    context: dict[str, Any] = {"error": None, "posted": None, **extra}
    code, nxt = 200, None
    matches: list[Match] = []
    progress: dict[int, Settling] = {}
    try:
        # The API's cursor rule: a time outside the accepted range is no cursor
        # of ours (it was a 500: past year 9999).
        cursor = time_cursor(after or None)
    except DomainError as err:
        code, context["error"] = err.status, err.detail
    else:
        matches, nxt, progress = await _matches(request, status, cursor)
    return render(
        request,
        "betting.html",
        session,
        code,
        status_name=status,
        statuses=STATUSES,
        matches=matches,
        progress=progress,
        next=nxt,
        now=site(request).clock.now(),
        **context,
    )


@router.get("/betting", response_class=HTMLResponse)
async def matches(
    request: Request,
    session: SignedIn,
    status: MatchStatus = "STARTED",
    after: Annotated[str | None, Query(max_length=200)] = None,
    posted: Annotated[int | None, Query(ge=1, le=2**63 - 1)] = None,
) -> HTMLResponse:
    """STARTED first: the matches waiting for a result or settling."""
    return await _page(request, session, status, after, posted=posted)


@router.post("/betting/results", response_model=None)
async def post_result(
    request: Request,
    session: Verified,
    match_id: Annotated[int, Form(ge=1, le=2**63 - 1)],
    external_id: Annotated[str, Form(min_length=1, max_length=200)],
    result_status: Annotated[Literal["FINISHED", "CANCELLED"], Form()],
    home_score: Annotated[str, Form(max_length=3)] = "",
    away_score: Annotated[str, Form(max_length=3)] = "",
) -> HTMLResponse | RedirectResponse:
    """The result, as the provider would have sent it, recorded as the admin's."""
    fields: dict[str, Any] = {
        "matchExternalId": external_id,
        "status": result_status,
        "providerEventId": "pending",
    }
    if result_status == "FINISHED":
        fields.update(homeScore=_score(home_score), awayScore=_score(away_score))
    intake: ResultIntake = request.app.state.results
    try:
        result = ResultIn.model_validate(fields)
        result = result.model_copy(
            update={"provider_event_id": manual_event_id(external_id, result)}
        )
        await intake.post_by_hand(result, session.sub)
    except ValidationError as exc:
        problems = "; ".join(e["msg"] for e in exc.errors(include_url=False))
        refused = await _page(
            request, session, "STARTED", None, error=f"match {match_id}: {problems}"
        )
        refused.status_code = 422
        return refused
    except DomainError as err:
        refused = await _page(
            request, session, "STARTED", None, error=f"match {match_id}: {err.detail}"
        )
        refused.status_code = err.status
        return refused
    return RedirectResponse(f"/console/betting?status=STARTED&posted={match_id}", status_code=303)
