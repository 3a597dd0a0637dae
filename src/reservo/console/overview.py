"""The overview page: live figures of the last minutes and the dependencies'
health. The page embeds its panels once; htmx then reloads the panels fragment
every few seconds (``overview_panels.html``), so the page works without
JavaScript too (it just does not refresh by itself)."""

from __future__ import annotations

from fastapi import APIRouter, Request
from fastapi.responses import HTMLResponse

from reservo.console.figures import WINDOW_S, Figures
from reservo.console.web import SignedIn, render

router = APIRouter(prefix="/console", include_in_schema=False)
REFRESH_S = 3


def _figures(request: Request) -> Figures:
    f: Figures = request.app.state.console_figures
    return f


@router.get("", response_class=HTMLResponse)
async def overview(request: Request, session: SignedIn) -> HTMLResponse:
    o = await _figures(request).overview()
    return render(request, "overview.html", session, o=o, refresh_s=REFRESH_S, window_s=WINDOW_S)


@router.get("/overview/panels", response_class=HTMLResponse)
async def overview_panels(request: Request, session: SignedIn) -> HTMLResponse:
    o = await _figures(request).overview()
    return render(
        request, "overview_panels.html", session, o=o, refresh_s=REFRESH_S, window_s=WINDOW_S
    )
