"""FastAPI glue shared by every module: problem+json errors, the caller's
identity, idempotent execution, request metrics."""

from __future__ import annotations

import time
from collections.abc import Awaitable, Callable
from typing import Annotated, Any, TypeVar, cast

import orjson
import structlog
from fastapi import Depends, FastAPI, Header, Path, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, Response
from pydantic import BaseModel
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from reservo.core.http.auth import Principal, TokenVerifier, UnknownKey
from reservo.core.http.idempotency import (
    Claim,
    IdempotencyStore,
    Replay,
    Within,
    is_stored,
    validate_key,
)
from reservo.core.http.schemas import MAX_ID, JsonRefused, read_json
from reservo.core.kernel import metrics
from reservo.core.kernel.clock import Clock
from reservo.core.kernel.errors import PROBLEM_JSON, DomainError, problem_body, validation_error

T = TypeVar("T")
# An id in a path (`Annotated[PathId, Path(alias="bookingId")]`): one name per
# collection on every route (`{bookingId}`, never `{id}`), so a generated client
# has one parameter name for one thing.
PathId = Annotated[int, Path(ge=1, le=MAX_ID)]

log = structlog.get_logger(__name__)


def json_bytes(status: int, body: bytes, headers: dict[str, str] | None = None) -> Response:
    """A response with already-serialised JSON, typed like ``json_response``."""
    media = PROBLEM_JSON if status >= 400 else "application/json"
    return Response(body, status_code=status, media_type=media, headers=headers)


def from_state(kind: type[T], name: str) -> Callable[[Request], T]:
    """The getter of what the app keeps on ``app.state`` under ``name`` (a
    module's ``state``, set by the app at start): ``_svc = from_state(X, "x")``."""

    def get(request: Request) -> T:
        return cast(T, getattr(request.app.state, name))

    return get


idempotency_store = from_state(IdempotencyStore, "idempotency")


def problem(err: DomainError) -> JSONResponse:
    return JSONResponse(
        err.problem(), status_code=err.status, headers=err.headers, media_type=PROBLEM_JSON
    )


def jsonable_errors(errors: list[Any]) -> list[dict[str, Any]]:
    out = []
    for e in errors:
        out.append(
            {
                "loc": [str(p) for p in e.get("loc", ())],
                "msg": str(e.get("msg", "")),
                "type": str(e.get("type", "")),
            }
        )
    return out


def install_error_handlers(app: FastAPI) -> None:
    @app.exception_handler(DomainError)
    async def _domain(_: Request, exc: DomainError) -> JSONResponse:
        return problem(exc)

    @app.exception_handler(RequestValidationError)
    async def _validation(_: Request, exc: RequestValidationError) -> JSONResponse:
        errors = jsonable_errors(list(exc.errors()))
        return problem(validation_error("the request is not valid", errors))

    @app.exception_handler(StarletteHTTPException)
    async def _http(_: Request, exc: StarletteHTTPException) -> JSONResponse:
        code = {404: "not_found", 405: "method_not_allowed", 413: "payload_too_large"}.get(
            exc.status_code, "http_error"
        )
        return JSONResponse(
            problem_body(exc.status_code, code, str(exc.detail)),
            status_code=exc.status_code,
            media_type=PROBLEM_JSON,
            headers=getattr(exc, "headers", None),
        )

    @app.exception_handler(Exception)
    async def _unexpected(_: Request, exc: Exception) -> JSONResponse:
        return unexpected_error(exc)


def unexpected_error(exc: Exception) -> JSONResponse:
    """The 500 of an exception nobody expected, logged (a hot route's too)."""
    log.exception("unhandled_error", error=repr(exc))
    return JSONResponse(
        problem_body(500, "internal_error", "unexpected error"),
        status_code=500,
        media_type=PROBLEM_JSON,
    )


def install_metrics(app: FastAPI) -> None:
    app.add_middleware(_ObserveRequests)


class RequestMetrics:
    """Request count and latency per method, route template and status. The
    labelled children are looked up once each: ``labels()`` validates and locks
    on every call. Same label sets as ``labels()`` would create."""

    def __init__(self) -> None:
        self._latency: dict[tuple[str, str], Any] = {}
        self._count: dict[tuple[str, str, int], Any] = {}

    def observe(self, method: str, route: str, status: int, seconds: float) -> None:
        latency = self._latency.get((method, route))
        if latency is None:
            latency = self._latency[method, route] = metrics.HTTP_LATENCY.labels(method, route)
        latency.observe(seconds)
        count = self._count.get((method, route, status))
        if count is None:
            count = self._count[method, route, status] = metrics.HTTP_REQUESTS.labels(
                method, route, str(status)
            )
        count.inc()


# One per process: the metrics middleware and the hot routes (core/http/hotroute.py) share it.
REQUEST_METRICS = RequestMetrics()


class _ObserveRequests:
    """Request count and latency per route template, as a plain ASGI middleware:
    ``@app.middleware("http")`` (BaseHTTPMiddleware) costs an anyio task group and
    memory streams per request, a large share of a cheap request's CPU."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        started = time.perf_counter()
        status = 500  # what the outer error middleware answers if the app raises

        async def observe_status(message: Message) -> None:
            nonlocal status
            if message["type"] == "http.response.start":
                status = message["status"]
            await send(message)

        try:
            await self.app(scope, receive, observe_status)
        finally:
            # The router writes the route it matched into the scope. Matching the
            # routes here instead missed every route of an included router.
            route = getattr(scope.get("route"), "path", None) or "unmatched"
            REQUEST_METRICS.observe(scope["method"], route, status, time.perf_counter() - started)


def install_body_limit(app: FastAPI, max_bytes: int) -> None:
    app.add_middleware(_LimitRequestBody, max_bytes=max_bytes)


class _BodyTooLarge(Exception):
    """Raised into the app from ``receive`` once a body passes the limit."""


class _LimitRequestBody:
    """Refuses request bodies over ``max_bytes`` with 413, before any of it is
    read and before authentication: a declared Content-Length over the limit is
    answered at once; an unsized (chunked) body is counted while it streams and
    cut off as soon as it passes the limit. Without this, every route read
    whatever size it was sent into memory."""

    def __init__(self, app: ASGIApp, max_bytes: int) -> None:
        self.app = app
        self.max_bytes = max_bytes

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        limit = self.max_bytes
        for name, value in scope["headers"]:
            # A malformed Content-Length is the server's to refuse; the stream
            # count below still applies. (Length before int(): int() refuses
            # thousands of digits by raising.)
            if name != b"content-length" or not value.isdigit():
                continue
            digits = value.lstrip(b"0")
            if len(digits) > 18 or int(digits or b"0") > limit:
                await _send_too_large(send, limit)
                return
        received = 0
        over = started = False

        async def limited_receive() -> Message:
            nonlocal received, over
            message = await receive()
            if message["type"] == "http.request":
                received += len(message.get("body", b""))
                if received > limit:
                    over = True
                    raise _BodyTooLarge
            return message

        async def guarded_send(message: Message) -> None:
            nonlocal started
            if over and not started:
                # Whatever the app answers to its cut-off body (FastAPI turns a
                # failing read into a 400) is replaced by the 413 below.
                return
            if message["type"] == "http.response.start":
                started = True
            await send(message)

        try:
            await self.app(scope, limited_receive, guarded_send)
        except Exception:
            if not over or started:
                raise
        if over and not started:
            await _send_too_large(send, limit)


async def _send_too_large(send: Send, limit: int) -> None:
    body = orjson.dumps(
        problem_body(413, "payload_too_large", f"the request body is larger than {limit} bytes")
    )
    await send(
        {
            "type": "http.response.start",
            "status": 413,
            "headers": [
                (b"content-type", PROBLEM_JSON.encode()),
                (b"content-length", str(len(body)).encode()),
                # The rest of the body is never read: the connection cannot be reused.
                (b"connection", b"close"),
            ],
        }
    )
    await send({"type": "http.response.body", "body": body})


def install_json_intake(app: FastAPI) -> None:
    """Every JSON body is read by core.http.schemas.read_json before a route sees it."""
    app.add_middleware(_StrictJson)


def is_json(scope: Scope) -> bool:
    """Whether the request declares a JSON body, as FastAPI decides to parse one
    (``application/json`` or ``application/*+json``, any parameters)."""
    for name, value in scope["headers"]:
        if name == b"content-type":
            media = value.split(b";", 1)[0].strip().lower()
            return media == b"application/json" or (
                media.startswith(b"application/") and media.endswith(b"+json")
            )
    return False


class _StrictJson:
    """Refuses a JSON body that breaks the intake rules (core.http.schemas.read_json)
    with 422 ``validation_error``, before any route runs. FastAPI's own reader
    (the standard library's) takes lone UTF-16 surrogates, NaN and integers of
    any size, and a route whose field is free-form (a job's payload) passed them
    on, to fail later as a 500. The body is read whole here, as the route would
    read it, and handed on unchanged."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or not is_json(scope):
            await self.app(scope, receive, send)
            return
        messages: list[Message] = []
        while True:
            message = await receive()
            messages.append(message)
            if message["type"] != "http.request" or not message.get("more_body", False):
                break
        if messages[-1]["type"] == "http.request":  # whole (else the client left)
            body = b"".join(m.get("body", b"") for m in messages)
            refusal = json_refusal(body) if body else None
            if refusal is not None:
                await refusal(scope, receive, send)
                return
        await self.app(scope, _replaying(messages, receive), send)


def json_refusal(body: bytes) -> JSONResponse | None:
    try:
        read_json(body)
    except JsonRefused as exc:
        error = {"loc": ["body"], "msg": str(exc), "type": "json_invalid"}
        return problem(validation_error("the request body is not acceptable JSON", [error]))
    return None


def _replaying(messages: list[Message], receive: Receive) -> Receive:
    """A receive that hands out ``messages`` again, then waits as before."""
    pending = list(messages)

    async def replay() -> Message:
        if pending:
            return pending.pop(0)
        return await receive()

    return replay


async def current_principal(
    request: Request,
    # Out of the OpenAPI document: the bearer security scheme stands for it there
    # (core/http/openapi.py), which is how generators and Swagger UI send a token.
    authorization: Annotated[str | None, Header(include_in_schema=False)] = None,
) -> Principal:
    # async on purpose: a sync dependency would be run in the thread pool, a thread
    # hop per request for a few microseconds of HMAC.
    tokens: TokenVerifier = request.app.state.tokens
    clock: Clock = request.app.state.clock
    try:
        return tokens.principal(authorization, clock.now())
    except UnknownKey as unknown:
        # An identity provider's key not in the set yet (a rotation): the set is
        # fetched again (rate limited, shared by every request), then one retry.
        # Hot routes call this same function (core/http/hotroute.py).
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
        caller.require(*self.roles)
        return caller


def role_caller(*roles: str) -> Any:
    """The caller of a route only ``roles`` (and admin) may use:
    ``Annotated[Principal, role_caller("doctor")]``."""
    return Depends(Roles(*roles))


AdminCaller = Annotated[Principal, role_caller()]


def json_response(status: int, body: Any) -> JSONResponse:
    media = PROBLEM_JSON if status >= 400 else "application/json"
    return JSONResponse(body, status_code=status, media_type=media)


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
    transaction (None without a key): it stores the same response there."""
    if key is None:
        return json_response(status, render(await use_case(None)))
    outcome = await store.begin(principal.key_owner, endpoint, key, body)
    if isinstance(outcome, Replay):
        return json_response(outcome.status, outcome.body)
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


M = TypeVar("M", bound=BaseModel)


def model_from(model: type[M], source: object, **given: Any) -> M:
    """A response ``model`` whose fields are ``source``'s attributes of the same
    names, but for the ``given`` ones (renamed or computed): what a domain object
    shows on the wire, without restating every field. Validated as the
    constructor validates, so the wire JSON is the constructor's."""
    taken = {name: getattr(source, name) for name in model.model_fields if name not in given}
    return model.model_validate({**taken, **given})
