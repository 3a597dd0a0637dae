"""What every console page shares: the templates, the navigation, the session
check, the CSRF check and the static assets.

A page is a router of its own (see ``overview.py``) whose handlers take
``SignedIn`` (any page) or ``Verified`` (any POST that changes something) and
answer ``render(request, "<template>.html", session, ...)``.
"""

from __future__ import annotations

from dataclasses import dataclass
from importlib import resources
from typing import Annotated, Any
from urllib.parse import quote, urlsplit

from fastapi import APIRouter, Depends, HTTPException, Request
from fastapi.responses import HTMLResponse, Response
from jinja2 import Environment, PackageLoader, StrictUndefined, select_autoescape

from reservo.console.figures import capped
from reservo.console.session import COOKIE, Session, Sessions, csrf_matches
from reservo.core.clock import Clock
from reservo.core.errors import DomainError

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
    NavItem("/console/jobs", "Jobs"),
    NavItem("/console/dead-letters", "Dead letters"),
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
    jwt_secret: str


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
    """The admin's session, or a redirect to the sign-in page."""
    s = site(request)
    session = s.sessions.read(request.cookies.get(COOKIE), s.clock.now())
    if session is None:
        raise _sign_in_first(request)
    return session


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


def safe_next(target: str | None) -> str:
    """Where to go after signing in: a console path only (no open redirect)."""
    if target and target.startswith("/console") and "//" not in target and "\\" not in target:
        return target
    return "/console"


# -- static assets: read once from the package, served with a long cache ----------

_TYPES = {".js": "text/javascript", ".css": "text/css", ".txt": "text/plain"}
_STATIC = {
    f.name: (f.read_bytes(), _TYPES[f.name[f.name.rfind(".") :]])
    for f in resources.files("reservo.console").joinpath("static").iterdir()
    if f.name[f.name.rfind(".") :] in _TYPES
}

static = APIRouter(prefix="/console/static", include_in_schema=False)


@static.get("/{name}")
async def asset(name: str) -> Response:
    """htmx (0BSD, vendored: static/htmx-LICENSE.txt) and the style sheet."""
    found = _STATIC.get(name)
    if found is None:
        raise HTTPException(404, "no such asset")
    body, media_type = found
    return Response(
        body,
        media_type=media_type,
        headers={"Cache-Control": "public, max-age=3600", "X-Content-Type-Options": "nosniff"},
    )
