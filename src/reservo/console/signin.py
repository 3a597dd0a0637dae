"""Signing in (an admin JWT, pasted once, for a session cookie) and out."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Form, Request
from fastapi.responses import HTMLResponse, RedirectResponse, Response

from reservo.console.session import COOKIE, PATH, SIGN_IN_COOKIE, SIGN_IN_TTL_S
from reservo.console.web import (
    SECURITY_HEADERS,
    SIGN_IN,
    Verified,
    render,
    revoke,
    safe_next,
    site,
)
from reservo.core.http.auth import TokenVerifier
from reservo.core.kernel.errors import DomainError

router = APIRouter(prefix="/console", include_in_schema=False)
# A JWT of reservo's is a few hundred characters; anything far longer is not one.
MAX_TOKEN_CHARS = 4096


def tokens(request: Request) -> TokenVerifier:
    """The API's token verifier: the console takes the tokens every API request takes."""
    verifier: TokenVerifier = request.app.state.tokens
    return verifier


def _form(
    request: Request, status: int = 200, error: str | None = None, next_: str = "/console"
) -> HTMLResponse:
    """The sign-in page with a fresh CSRF value (in a cookie and in the form)."""
    sessions = site(request).sessions
    cookie, nonce = sessions.sign_in_token()
    page = render(request, "signin.html", None, status, error=error, nonce=nonce, next=next_)
    page.set_cookie(SIGN_IN_COOKIE, cookie, **sessions.cookie_options(SIGN_IN_TTL_S))
    return page


@router.get("/sign-in", response_class=HTMLResponse)
async def sign_in_page(request: Request, next: str | None = None) -> HTMLResponse:
    return _form(request, next_=safe_next(next))


@router.post("/sign-in", response_model=None)
async def sign_in(
    request: Request,
    token: Annotated[str, Form(max_length=MAX_TOKEN_CHARS)] = "",
    nonce: Annotated[str, Form(max_length=200)] = "",
    next: Annotated[str, Form(max_length=2000)] = "/console",
) -> Response:
    s = site(request)
    target = safe_next(next)
    if not s.sessions.sign_in_matches(request.cookies.get(SIGN_IN_COOKIE), nonce):
        return _form(
            request, 403, "This form expired or did not come from this page. Try again.", target
        )
    now = s.clock.now()
    try:
        principal, exp = await tokens(request).checked(token.strip(), now)
    except DomainError as err:
        return _form(request, 401, f"That token was not accepted: {err.detail}.", target)
    if not principal.is_admin:
        return _form(
            request,
            403,
            f"That token belongs to a {principal.role}; the console is for admins only.",
            target,
        )
    value, session = s.sessions.open(principal, exp, now)
    answer = RedirectResponse(target, status_code=303, headers=SECURITY_HEADERS)
    answer.set_cookie(
        COOKIE, value, **s.sessions.cookie_options(session.expires - int(now.timestamp()))
    )
    answer.delete_cookie(SIGN_IN_COOKIE, path=PATH)
    return answer


@router.post("/sign-out")
async def sign_out(request: Request, session: Verified) -> RedirectResponse:
    """Ends the session on the server too: deleting the cookie only ends it in
    this browser, and a copy of it (a proxy log, a shared machine) would live on."""
    await revoke(request, session)
    answer = RedirectResponse(SIGN_IN, status_code=303, headers=SECURITY_HEADERS)
    answer.delete_cookie(COOKIE, path=PATH)
    return answer
