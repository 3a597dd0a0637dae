"""Who is calling: the verified principal of a request (its bearer token) and
the role rules routes declare as dependencies."""

from __future__ import annotations

from typing import Annotated, Any

from fastapi import Depends, Header, Request

from reservo.core.http.auth import Principal, TokenVerifier, UnknownKey
from reservo.core.kernel.clock import Clock


async def current_principal(
    request: Request,
    # Out of the OpenAPI document: the bearer security scheme stands for it there
    # (core/http/openapi.py), which is how generators and Swagger UI send a token.
    authorization: Annotated[str | None, Header(include_in_schema=False)] = None,
) -> Principal:
    # async on purpose: a sync dependency would be run in the thread pool, a thread
    # hop per request for a few microseconds of HMAC.
    return await principal_of(request.app.state, authorization)


async def principal_of(state: Any, authorization: str | None) -> Principal:
    """The caller of a request to the app whose ``app.state`` is ``state``, by
    its Authorization header: ``current_principal``'s work, which the hot
    routes (core/http/hotroute.py) call without a Request."""
    tokens: TokenVerifier = state.tokens
    clock: Clock = state.clock
    try:
        return tokens.principal(authorization, clock.now())
    except UnknownKey as unknown:
        # An identity provider's key not in the set yet (a rotation): the set is
        # fetched again (rate limited, shared by every request), then one retry.
        await tokens.learn(unknown)
        return tokens.principal(authorization, clock.now())


Caller = Annotated[Principal, Depends(current_principal)]


class Roles:
    """A route's role rule, as a dependency: ``Annotated[Principal, Depends(Roles(
    "patient"))]``. FastAPI solves dependencies before it validates the body,
    path and query, so a caller whose role may never use the route gets its 403
    before any 422 could tell it what the route expects. Admin passes every rule.
    Owner rules (which patient, which account) stay in the route: they need the
    request."""

    __slots__ = ("roles",)

    def __init__(self, *roles: str) -> None:
        self.roles = frozenset(roles)

    async def __call__(self, caller: Caller) -> Principal:
        self.check(caller)
        return caller

    def check(self, caller: Principal) -> None:
        """The rule itself, for a caller already known (a hot route's)."""
        caller.require(*self.roles)


def role_caller(*roles: str) -> Any:
    """The caller of a route only ``roles`` (and admin) may use:
    ``Annotated[Principal, role_caller("doctor")]``."""
    return Depends(Roles(*roles))


AdminCaller = Annotated[Principal, role_caller()]
