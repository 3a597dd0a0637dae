"""The dead-letters page: events consumers rejected, newest first (optionally of
one consumer), one letter's event and error, and its replay. The list, the
letter and the replay are the dead-letter box's use cases
(``request.app.state.dead_letters``), the replay the very one
POST /api/ops/dead-letters/{id}/replay calls."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Path, Query, Request
from fastapi.responses import HTMLResponse, RedirectResponse, Response

from reservo.console.figures import Figures
from reservo.console.web import SignedIn, Verified, render, render_refused
from reservo.core.kernel.errors import DomainError
from reservo.core.messaging.deadletters import DeadLetterBox

router = APIRouter(prefix="/console", include_in_schema=False)
PAGE = 50
LetterId = Annotated[int, Path(ge=1, le=2**63 - 1)]


def _box(request: Request) -> DeadLetterBox:
    box: DeadLetterBox = request.app.state.dead_letters
    return box


@router.get("/dead-letters", response_class=HTMLResponse)
async def dead_letters(
    request: Request,
    session: SignedIn,
    consumer: Annotated[str, Query(max_length=200)] = "",
    before: Annotated[int | None, Query(ge=1, le=2**63 - 1)] = None,
) -> HTMLResponse:
    letters = await _box(request).page(consumer or None, before, PAGE + 1)
    shown = letters[:PAGE]
    figures: Figures = request.app.state.console_figures
    return render(
        request,
        "dead_letters.html",
        session,
        letters=shown,
        more=shown[-1].id if len(letters) > PAGE else None,
        consumer=consumer,
        waiting=await figures.dead_letter_consumers(),
    )


async def _letter_page(
    request: Request, session: SignedIn, letter_id: int, error: str | None = None, status: int = 200
) -> HTMLResponse:
    try:
        found = await _box(request).inspect(letter_id)
    except DomainError as err:
        return render_refused(request, "dead_letter.html", session, err, found=None)
    return render(request, "dead_letter.html", session, status=status, error=error, found=found)


@router.get("/dead-letters/{letter_id}", response_class=HTMLResponse)
async def dead_letter(request: Request, session: SignedIn, letter_id: LetterId) -> HTMLResponse:
    return await _letter_page(request, session, letter_id)


@router.post("/dead-letters/{letter_id}/replay", response_model=None)
async def replay(request: Request, session: Verified, letter_id: LetterId) -> Response:
    """Delivers the event again to the consumer that parked it (applied at most
    once: the consumer dedupes by event id). A refusal shows on the page."""
    try:
        await _box(request).replay(letter_id)
    except DomainError as err:
        return await _letter_page(request, session, letter_id, err.detail, err.status)
    return RedirectResponse(f"/console/dead-letters/{letter_id}", status_code=303)
