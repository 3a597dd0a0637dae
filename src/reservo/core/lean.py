"""A lean raw-ASGI path for the hottest routes, in front of the unchanged FastAPI app.

FastAPI's per-request work (routing, dependency solving, pydantic, the request
and response objects) costs several hundred microseconds of a 2-core machine's
CPU per request, more than the booking gate's Redis call or a cached slot list.
A module may declare a ``LeanRoute`` for a route it also serves through FastAPI:
this layer answers requests of that method and path itself when they take the
common shape, with the same use-case code and the same renderers, and hands
every other request to FastAPI unchanged. So the OpenAPI schema, every error and
every header stay FastAPI's, and the lean path only has to be exact on the
requests it accepts:

- a handler returns ``None`` ("not mine") for anything it does not parse with
  certainty (a missing or refused token, an odd body, content type or query),
  and FastAPI answers it, errors included;
- a ``DomainError`` from the use case is rendered by the same ``problem()`` the
  FastAPI error handler uses, any other exception by the same 500 handler;
- the layer sits in front of the app's middleware stack (each layer of which
  costs every request a few frames on each await), so it records the request
  metrics itself, with the same labels (the FastAPI route's template), and only
  takes bodies whose declared size is within the limit: anything else, the
  413s included, is the stack's.
"""

from __future__ import annotations

import re
import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any, TypeVar

import orjson
from fastapi import FastAPI
from pydantic import BaseModel, ValidationError
from starlette.responses import Response
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from reservo.core.auth import Principal, TokenVerifier
from reservo.core.errors import PROBLEM_JSON, DomainError
from reservo.core.http import REQUEST_METRICS, unexpected_error
from reservo.core.schemas import MAX_ID, JsonRefused, read_json

M = TypeVar("M", bound=BaseModel)

# A path parameter the lean path accepts: the canonical spelling of an id.
_ID = "[1-9][0-9]{0,18}"


@dataclass(frozen=True, slots=True)
class LeanRequest:
    scope: Scope
    params: dict[str, str]
    body: bytes
    now: datetime
    tokens: TokenVerifier
    app_state: Any  # the FastAPI app's state: what the routes read from it

    def header(self, name: bytes) -> str | None:
        """The first header of that (lower-case) name, as Starlette reads it."""
        for key, value in self.scope["headers"]:
            if key == name:
                return str(value.decode("latin-1"))
        return None

    def principal(self) -> Principal | None:
        """The verified caller, or None (FastAPI then answers the 401)."""
        try:
            return self.tokens.principal(self.header(b"authorization"), self.now)
        except DomainError:
            return None

    def id_param(self, name: str) -> int | None:
        value = int(self.params[name])
        return value if value <= MAX_ID else None

    def json_body(self) -> Any:
        """The body as the app's JSON intake reads it (core.schemas.read_json),
        or None when it is not plainly ``application/json`` or breaks a rule
        (FastAPI then decides, its 422 included)."""
        ctype = self.header(b"content-type")
        if ctype is None or ctype.lower() not in (
            "application/json",
            "application/json; charset=utf-8",
        ):
            return None
        try:
            return read_json(self.body)
        except JsonRefused:
            return None

    def model_body(self, model: type[M]) -> M | None:
        """The body as ``model``, or None when it is not a JSON object ``model``
        accepts (FastAPI then answers, errors included)."""
        data = self.json_body()
        if type(data) is not dict:
            return None
        try:
            return model.model_validate(data)
        except ValidationError:
            return None


class RawJson:
    """A JSON answer sent as the two ASGI messages Starlette's ``Response`` would
    send for it (same headers, same order), without building a Response: that
    object's header handling was a visible share of a refused booking's CPU."""

    __slots__ = ("body", "start", "status_code")

    def __init__(self, status: int, body: bytes, headers: dict[str, str] | None = None) -> None:
        media = PROBLEM_JSON if status >= 400 else "application/json"
        raw = [
            (k.lower().encode("latin-1"), v.encode("latin-1")) for k, v in (headers or {}).items()
        ]
        raw.append((b"content-length", str(len(body)).encode("latin-1")))
        raw.append((b"content-type", media.encode("latin-1")))
        self.status_code = status
        self.start: Message = {"type": "http.response.start", "status": status, "headers": raw}
        self.body: Message = {"type": "http.response.body", "body": body}

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        await send(self.start)
        await send(self.body)


# A lean answer: a ready ASGI response, or None to hand the request to FastAPI.
LeanResponse = Response | RawJson
LeanHandler = Callable[[LeanRequest], Awaitable[LeanResponse | None]]


@dataclass(frozen=True)
class LeanRoute:
    """``template`` is the FastAPI route's path, e.g. ``/api/doctors/{doctorId}/slots``;
    every ``{name}`` parameter must be an id (``[1-9][0-9]*``) on the lean path."""

    method: str
    template: str
    handler: LeanHandler

    def pattern(self) -> re.Pattern[str]:
        parts = re.split(r"\{(\w+)\}", self.template)
        regex = "".join(
            re.escape(p) if i % 2 == 0 else f"(?P<{p}>{_ID})" for i, p in enumerate(parts)
        )
        return re.compile(f"^{regex}$", re.ASCII)


@dataclass(frozen=True, slots=True)
class _Matched:
    """What the router writes into ``scope["route"]`` as far as the metrics
    middleware reads it (the path template)."""

    path: str
    methods: frozenset[str]


class LeanLayer:
    """The lean path in front of an app: ``LeanLayer(app, routes, fastapi_app,
    max_body_bytes)`` answers the lean routes' common requests and passes every
    other request (and every other scope type) to ``app``, the FastAPI app's
    own entry (its whole middleware stack)."""

    def __init__(
        self,
        app: ASGIApp,
        routes: Sequence[LeanRoute],
        fastapi_app: FastAPI,
        max_body_bytes: int,
    ) -> None:
        self.app = app
        self.fastapi_app = fastapi_app
        self.max_body_bytes = max_body_bytes
        self._routes: dict[str, list[tuple[re.Pattern[str], LeanRoute, _Matched]]] = {}
        for route in routes:
            self._routes.setdefault(route.method, []).append(
                (route.pattern(), route, self._fastapi_route(route))
            )

    def _fastapi_route(self, lean: LeanRoute) -> _Matched:
        """The FastAPI route a lean route stands in for; it must exist (and so be
        in the OpenAPI schema) with that method and path template."""
        operations = self.fastapi_app.openapi().get("paths", {}).get(lean.template, {})
        if lean.method.lower() not in operations:
            raise ValueError(f"lean route {lean.method} {lean.template} has no FastAPI route")
        return _Matched(lean.template, frozenset({lean.method}))

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        candidates = self._routes.get(scope.get("method", "")) if scope["type"] == "http" else None
        if candidates:
            path = scope["path"]
            for pattern, lean, route in candidates:
                m = pattern.match(path)
                if m is not None:
                    await self._serve(scope, receive, send, lean, route, m.groupdict())
                    return
        await self.app(scope, receive, send)

    async def _serve(
        self,
        scope: Scope,
        receive: Receive,
        send: Send,
        lean: LeanRoute,
        route: _Matched,
        params: dict[str, str],
    ) -> None:
        started = time.perf_counter()
        body = b""
        if lean.method in ("POST", "PUT", "PATCH"):
            if not _sized_within(scope, self.max_body_bytes):
                # Unsized, oversized or odd: FastAPI's (and the body limit's) call.
                await self.app(scope, receive, send)
                return
            read = await _read_body(receive)
            if read is None:  # the client went away mid-body: nobody to answer
                REQUEST_METRICS.observe(lean.method, "unmatched", 500, 0.0)
                return
            body = read
            receive = _replay(body, receive)
        state = self.fastapi_app.state
        request = LeanRequest(scope, params, body, state.clock.now(), state.tokens, state)
        response: LeanResponse | None
        try:
            response = await lean.handler(request)
        except DomainError as err:
            response = problem_response(err)
        except Exception as exc:
            # As the app's error middleware does: the 500, then the exception to the
            # server, which logs it.
            REQUEST_METRICS.observe(lean.method, "unmatched", 500, time.perf_counter() - started)
            await unexpected_error(exc)(scope, receive, send)
            raise
        if response is None:
            await self.app(scope, receive, send)
            return
        scope["route"] = route  # what the router would have written
        try:
            await response(scope, receive, send)
        finally:
            REQUEST_METRICS.observe(
                lean.method, lean.template, response.status_code, time.perf_counter() - started
            )


def problem_response(err: DomainError) -> RawJson:
    """The FastAPI handler's ``problem(err)``, serialised the same way."""
    return RawJson(err.status, _dumps(err.problem()), err.headers)


def _dumps(body: Any) -> bytes:
    # Starlette's JSONResponse writes compact JSON with raw UTF-8; so does orjson.
    return orjson.dumps(body)


def _sized_within(scope: Scope, limit: int) -> bool:
    """True when the body has one well-formed Content-Length within the limit."""
    declared = None
    for name, value in scope["headers"]:
        if name == b"content-length":
            if declared is not None or not value.isdigit() or len(value) > 18:
                return False
            declared = int(value)
    return declared is not None and declared <= limit


async def _read_body(receive: Receive) -> bytes | None:
    """The whole body, or None when the client disconnected before its end."""
    chunks = []
    while True:
        message = await receive()
        if message["type"] != "http.request":
            return None
        chunks.append(message.get("body", b""))
        if not message.get("more_body", False):
            return b"".join(chunks)


def _replay(body: bytes, receive: Receive) -> Receive:
    """A receive that hands the already-read body out once, then waits as before."""
    sent = False

    async def replay() -> Message:
        nonlocal sent
        if not sent:
            sent = True
            return {"type": "http.request", "body": body, "more_body": False}
        return await receive()

    return replay


# A write's use-case flow once its request is parsed, which the FastAPI route and
# the lean path both run: (the app's state, the caller, the body, the
# Idempotency-Key header, the raw body).
BodyFlow = Callable[[Any, Principal, M, str | None, bytes], Awaitable[Response]]


def body_route(method: str, template: str, model: type[M], flow: BodyFlow[M]) -> LeanRoute:
    """The lean route of a write that needs only a verified caller and a body
    ``model`` accepts; anything else goes to the FastAPI route."""

    async def handle(req: LeanRequest) -> Response | None:
        caller, body = req.principal(), req.model_body(model)
        if caller is None or body is None:
            return None
        return await flow(req.app_state, caller, body, req.header(b"idempotency-key"), req.body)

    return LeanRoute(method, template, handle)
