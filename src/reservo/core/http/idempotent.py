"""Idempotent creation for routes: the Idempotency-Key headers they declare and
the run of a use case at most once per (caller, endpoint, key)
(core/http/idempotency.py is the store)."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Annotated, Any, TypeVar

import structlog
from fastapi import Header, Request
from fastapi.responses import JSONResponse

from reservo.core.http.auth import Principal
from reservo.core.http.idempotency import (
    Claim,
    IdempotencyStore,
    Replay,
    Within,
    is_stored,
    validate_key,
)
from reservo.core.http.responses import json_response
from reservo.core.http.route_inputs import from_state
from reservo.core.kernel.errors import DomainError

T = TypeVar("T")
log = structlog.get_logger(__name__)

idempotency_store = from_state(IdempotencyStore, "idempotency")


async def run_idempotent(
    store: IdempotencyStore,
    principal: Principal,
    endpoint: str,
    key: str | None,
    body: bytes,
    use_case: Callable[[Within[T] | None], Awaitable[T]],
    render: Callable[[T], Any],
    status: int = 201,
) -> JSONResponse:
    """Run ``use_case`` at most once per (caller, endpoint, key) and answer
    ``render(created)``. The use case gets a ready-made hook to run inside its
    transaction (None without a key): it stores the same response there. A
    request whose key another one is running waits for that one's answer
    (``IdempotencyStore.begin``)."""
    if key is None:
        return json_response(status, render(await use_case(None)))
    outcome = await store.begin(principal.key_owner, endpoint, key, body)
    if isinstance(outcome, Replay):
        return json_response(outcome.status, outcome.body)
    with store.in_flight(outcome):
        try:
            payload = render(await use_case(outcome.storing(status, render)))
        except DomainError as err:
            # A deterministic refusal is stored (the same key gets the same answer);
            # who may not act and passing conditions are not (is_stored).
            if is_stored(err):
                await store.finish(outcome, err.status, err.problem())
            else:
                await _release_quietly(store, outcome)
            raise
        except BaseException:
            await _release_quietly(store, outcome)
            raise
    return json_response(status, payload)


async def run_idempotent_route(
    request: Request,
    principal: Principal,
    endpoint: str,
    key: str | None,
    use_case: Callable[[Within[T] | None], Awaitable[T]],
    render: Callable[[T], Any],
    status: int = 201,
) -> JSONResponse:
    """``run_idempotent`` for a FastAPI route: the app's store, the request's raw
    body (the key is checked by the route, where its 400 belongs in order)."""
    store, body = idempotency_store(request), await request.body()
    return await run_idempotent(store, principal, endpoint, key, body, use_case, render, status)


async def _release_quietly(store: IdempotencyStore, claim: Claim) -> None:
    try:
        await store.release(claim)
    except Exception as exc:  # the lease expires on its own
        log.warning("idempotency_release_failed", error=repr(exc))


IDEMPOTENCY_HEADER = "Idempotency-Key"
# In the header's schema, read and removed by core/http/openapi.py: `required: true`.
KEY_REQUIRED = "x-key-required"
IdempotencyKey = Annotated[
    str | None,
    Header(alias=IDEMPOTENCY_HEADER, description="1-255 visible ASCII characters"),
]
# The key of a route that refuses a request without it (it calls required_key).
# Optional to FastAPI all the same: its absence is the route's 400
# `idempotency_key_required`, in the order the route checks it, not a 422.
RequiredIdempotencyKey = Annotated[
    str | None,
    Header(
        alias=IDEMPOTENCY_HEADER,
        description="1-255 visible ASCII characters; required",
        json_schema_extra={KEY_REQUIRED: True},
    ),
]


def required_key(key: str | None) -> str:
    checked = validate_key(key, required=True)
    assert checked is not None
    return checked
