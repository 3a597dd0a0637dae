"""What every console page shares: the templates, the navigation, the session
check, the CSRF check and the static assets.

A page is a router of its own (see ``overview.py``) whose handlers take
``SignedIn`` (any page) or ``Verified`` (any POST that changes something) and
answer ``render(request, "<template>.html", session, ...)``.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from datetime import UTC, date, datetime
from importlib import resources
from typing import Annotated, Any
from urllib.parse import quote, urlsplit

from fastapi import APIRouter, Depends, HTTPException, Request
from fastapi.responses import HTMLResponse, Response
from jinja2 import Environment, PackageLoader, StrictUndefined, select_autoescape

from reservo.console import repo
from reservo.console.figures import capped
from reservo.console.session import COOKIE, Session, Sessions, csrf_matches
from reservo.core.db.database import Database
from reservo.core.http.schemas import EARLIEST_DAY, LATEST_DAY
from reservo.core.kernel.clock import Clock
from reservo.core.kernel.errors import DomainError

SIGN_IN = "/console/sign-in"
CSRF_HEADER = "X-CSRF-Token"
CSRF_FIELD = "csrf"


@dataclass(frozen=True)
class NavItem:
    path: str
    label: str


# The navigation, in order. A new page adds its entry here (docs/ARCHITECTURE.md,
# "How to add a console page").
NAV: tuple[NavItem, ...] = (
    NavItem("/console", "Overview"),
    NavItem("/console/clinic", "Clinic"),
    NavItem("/console/rentals", "Rentals"),
    NavItem("/console/betting", "Betting"),
    NavItem("/console/people", "People"),
    NavItem("/console/jobs", "Jobs"),
    NavItem("/console/dead-letters", "Dead letters"),
    NavItem("/console/webhooks", "Webhooks"),
)

# Every console answer: never cached, never framed, nothing but our own assets.
SECURITY_HEADERS = {
    "Cache-Control": "no-store",
    "X-Frame-Options": "DENY",
    "X-Content-Type-Options": "nosniff",
    "Referrer-Policy": "same-origin",
    "Content-Security-Policy": (
        "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self' data:; "
        "connect-src 'self'; form-action 'self'; frame-ancestors 'none'; base-uri 'none'"
    ),
}

templates = Environment(
    loader=PackageLoader("reservo.console", "templates"),
    autoescape=select_autoescape(default=True),
    undefined=StrictUndefined,
    trim_blocks=True,
    lstrip_blocks=True,
)
templates.filters["capped"] = capped


@dataclass(frozen=True)
class Site:
    """What the console's routes read from ``request.app.state.console``."""

    sessions: Sessions
    clock: Clock
    db: Database  # where signed-out sessions are recorded


def site(request: Request) -> Site:
    s: Site = request.app.state.console
    return s


def render(
    request: Request, template: str, session: Session | None, status: int = 200, **context: Any
) -> HTMLResponse:
    """A page (or an htmx fragment) with the navigation and the CSRF token."""
    html = templates.get_template(template).render(
        nav=NAV,
        current=request.url.path,
        session=session,
        csrf=session.csrf if session else "",
        csrf_field=CSRF_FIELD,
        csrf_header=CSRF_HEADER,
        **context,
    )
    return HTMLResponse(html, status_code=status, headers=SECURITY_HEADERS)


def render_refused(
    request: Request, template: str, session: Session | None, err: DomainError, **context: Any
) -> HTMLResponse:
    """The page saying why the use case refused (``err``'s detail as ``error``),
    with the status the API would have answered."""
    return render(request, template, session, status=err.status, error=err.detail, **context)


def _sign_in_first(request: Request) -> HTTPException:
    """303 to the sign-in page, coming back here afterwards; an htmx request
    (a panel refreshing itself) is told to load the sign-in page instead of
    swapping it into the panel."""
    if request.headers.get("HX-Request"):
        return HTTPException(401, "sign in first", headers={"HX-Redirect": SIGN_IN})
    back = request.url.path if request.method == "GET" else "/console"
    return HTTPException(
        303, "sign in first", headers={"Location": f"{SIGN_IN}?next={quote(back)}"}
    )


async def signed_in(request: Request) -> Session:
    """The admin's session, or a redirect to the sign-in page: also for a
    signed-out session's cookie (a copy of it, or a replay)."""
    s = site(request)
    session = s.sessions.read(request.cookies.get(COOKIE), s.clock.now())
    if session is None:
        raise _sign_in_first(request)
    # When PostgreSQL is away this raises (503): the console fails closed.
    async with s.db.connection() as conn:
        if await repo.session_revoked(conn, session.id):
            raise _sign_in_first(request)
    return session


async def revoke(request: Request, session: Session) -> None:
    """Signs the session out for good: its cookie, wherever a copy of it is,
    is refused until its expiry (after which it is refused anyway)."""
    s = site(request)
    expires = datetime.fromtimestamp(session.expires, UTC)
    async with s.db.connection() as conn:
        await repo.revoke_session(conn, session.id, expires, s.clock.now())


async def verified(request: Request, session: Annotated[Session, Depends(signed_in)]) -> Session:
    """``signed_in``, and the request carries the session's CSRF token (form
    field or htmx header) and, when the browser says where it comes from, comes
    from this site. Every state-changing POST takes this."""
    origin = request.headers.get("Origin")
    # The host only: behind a TLS proxy the scheme the app sees may differ.
    if origin is not None and urlsplit(origin).netloc != request.headers.get("Host"):
        raise HTTPException(403, "cross-site request refused")
    sent = request.headers.get(CSRF_HEADER)
    if sent is None:
        form = await request.form()
        field = form.get(CSRF_FIELD)
        sent = field if isinstance(field, str) else None
    if not csrf_matches(session, sent):
        raise HTTPException(403, "missing or wrong CSRF token: reload the page and try again")
    return session


SignedIn = Annotated[Session, Depends(signed_in)]
Verified = Annotated[Session, Depends(verified)]


# A day as the API takes one: four-digit year, two-digit month and day, nothing
# else (date.fromisoformat also takes "20260501" or week dates like "2026-W18-5").
_DAY = re.compile(r"[0-9]{4}-[0-9]{2}-[0-9]{2}", re.ASCII)


def parse_day(raw: str | None, default: date) -> tuple[date, str | None]:
    """(the day, None) for a ``YYYY-MM-DD`` day in the API's accepted range, the
    default for an absent one, or (the default, why) for anything else, which
    the page then shows with a 422 instead of reading or computing with it."""
    if raw is None:
        return default, None
    try:
        day = date.fromisoformat(raw) if _DAY.fullmatch(raw) else None
    except ValueError:
        day = None
    if day is None:
        return default, f"{raw[:40]!r} is not a day: use YYYY-MM-DD."
    if not EARLIEST_DAY <= day <= LATEST_DAY:
        return default, (
            f"{raw} is outside the accepted days, {EARLIEST_DAY.isoformat()} "
            f"to {LATEST_DAY.isoformat()}."
        )
    return day, None


def safe_next(target: str | None) -> str:
    """Where to go after signing in: a console path only (no open redirect)."""
    if target and target.startswith("/console") and "//" not in target and "\\" not in target:
        return target
    return "/console"


# -- static assets: read once from the package, served with a long cache ----------

_TYPES = {
    ".js": "text/javascript",
    ".css": "text/css",
    ".txt": "text/plain",
    ".svg": "image/svg+xml",
}
_STATIC = {
    f.name: (f.read_bytes(), _TYPES[f.name[f.name.rfind(".") :]])
    for f in resources.files("reservo.console").joinpath("static").iterdir()
    if f.name[f.name.rfind(".") :] in _TYPES
}

static = APIRouter(prefix="/console/static", include_in_schema=False)


@static.get("/{name}")
async def asset(name: str) -> Response:
    """htmx (0BSD, vendored: static/htmx-LICENSE.txt), the style sheet and the icon."""
    found = _STATIC.get(name)
    if found is None:
        raise HTTPException(404, "no such asset")
    body, media_type = found
    return Response(
        body,
        media_type=media_type,
        headers={"Cache-Control": "public, max-age=3600", "X-Content-Type-Options": "nosniff"},
    )
