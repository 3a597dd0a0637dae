"""Hot routes: FastAPI routes served by one raw-ASGI implementation built from
their own declaration.

FastAPI's per-request work (the middleware stack, routing, dependency solving,
the exit stacks) costs several hundred microseconds of a 2-core machine's CPU
per request, more than the booking gate's Redis call or a cached slot list. A
module names the endpoints of its hottest routes (``Module.hot``); each stays an
ordinary ``@router.get/post(...)`` declaration (method, path, parameters, body
model, response model, status, role dependency, ``operation_id``, ``raises``),
so its OpenAPI entry is FastAPI's, unchanged. At registration ``compile_route``
reads that declaration once (as litestar builds a route's parameter extraction
at registration) and makes the route's ASGI app, which replaces FastAPI's
request handler for that route. It:

- reads the body and refuses JSON the intake rules refuse (core.http.schemas.read_json)
  with the same 422 ``_StrictJson`` answers, before anything else;
- authenticates with the same dependency (``current_principal``, a ``Roles``
  rule), in the declaration's order, so a 401/403 comes before any 422;
- validates the path, query and header parameters and the body with the
  route's own pydantic fields (pydantic-core), collecting FastAPI's errors, and
  answers them as the app's validation handler does;
- calls the endpoint with those arguments and sends the Response it returns;
  a ``DomainError`` is rendered by the same ``problem()`` as everywhere.

``HotLayer`` sits in front of the whole middleware stack and hands a hot
route's request straight to that app, counting it in the request metrics with
the same labels; everything else, and a hot write whose body is not one
Content-Length within the limit (the body limit's to refuse or count), goes
through the stack, whose router reaches the same app. There is one
implementation either way: the stack only adds what it adds to every route.
"""

from __future__ import annotations

import inspect
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any
from urllib.parse import parse_qsl

import orjson
from fastapi import FastAPI, Request
from fastapi._compat import ModelField, Undefined, field_annotation_is_sequence
from fastapi.dependencies.models import Dependant
from fastapi.dependencies.utils import (
    _get_param_aliases,
    _get_param_model,
    _is_json_field,
    _validate_value_with_model_field,
)
from fastapi.routing import APIRoute, iter_route_contexts
from starlette.responses import Response
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from reservo.core.http.glue import (
    REQUEST_METRICS,
    Roles,
    current_principal,
    is_json,
    json_refusal,
    jsonable_errors,
    unexpected_error,
)
from reservo.core.http.schemas import JsonRefused, read_json
from reservo.core.kernel.errors import PROBLEM_JSON, DomainError, validation_error

_MISSING = object()
# What FastAPI answers for a required body that was not sent.
_BODY_MISSING = {"type": "missing", "loc": ("body",), "msg": "Field required"}


@dataclass(frozen=True, slots=True)
class _Caller:
    """A dependency of the endpoint: the verified caller, under ``name``, held
    to ``roles`` when the declaration names a ``Roles`` rule."""

    name: str
    roles: Roles | None


@dataclass(frozen=True, slots=True)
class _Param:
    """A path, query or header parameter as ``request_params_to_args`` reads
    it, its aliases and location worked out once: the first alias the request
    has (else the first), its value validated by the parameter's own field."""

    field: ModelField
    aliases: tuple[str, ...]
    where: str  # "path", "query" or "header"

    def read(self, source: Any, values: dict[str, Any], errors: list[Any]) -> None:
        alias = self.aliases[0]
        if len(self.aliases) > 1:
            alias = next((a for a in self.aliases if a in source), alias)
        value = source.get(alias)
        value, found = _validate_value_with_model_field(
            field=self.field,
            value=Undefined if value is None else value,
            values=values,
            loc=(self.where, alias),
        )
        if found:
            errors.extend(found)
        else:
            values[self.field.name] = value


def _params(fields: Sequence[ModelField], where: str, route: str) -> list[_Param]:
    out = []
    for field in fields:
        if (
            _get_param_model(field) is not None
            or _is_json_field(field)
            or field_annotation_is_sequence(field.field_info.annotation)
        ):
            raise ValueError(f"{route}: only single-valued parameters are supported")
        aliases = tuple(request for _, request in _get_param_aliases(field))
        out.append(_Param(field, aliases, where))
    return out


def _callers(dependant: Dependant, where: str) -> list[_Caller]:
    out = []
    for sub in dependant.dependencies:
        if sub.name is None:
            raise ValueError(f"{where}: a dependency without a parameter is not supported")
        if sub.call is current_principal:
            out.append(_Caller(sub.name, None))
        elif isinstance(sub.call, Roles):
            out.append(_Caller(sub.name, sub.call))
        else:
            raise ValueError(f"{where}: only the caller dependencies are supported")
    return out


def compile_route(route: Any) -> ASGIApp:
    """The ASGI app serving ``route`` (an APIRoute, or the context FastAPI
    resolves an included router's route to) from its declaration (see the
    module doc). Raises ValueError for a declaration outside what it supports
    (a sync endpoint, cookies, several or embedded bodies, multi-valued
    parameters, dependencies other than the caller's); the endpoint must return
    a Response (TypeError when it does not)."""
    return _Compiled(route)


def _check_supported(route: Any, where: str) -> None:
    dependant = route.dependant
    if dependant.cookie_params or len(dependant.body_params) > 1:
        raise ValueError(f"{where}: cookies and several bodies are not supported")
    if dependant.body_params and route._embed_body_fields:
        raise ValueError(f"{where}: an embedded body is not supported")
    if any(
        name is not None
        for name in (
            dependant.websocket_param_name,
            dependant.http_connection_param_name,
            dependant.response_param_name,
            dependant.background_tasks_param_name,
            dependant.security_scopes_param_name,
        )
    ):
        raise ValueError(f"{where}: only a Request parameter is supported")
    if not inspect.iscoroutinefunction(route.endpoint):
        raise ValueError(f"{where}: the endpoint must be async (no thread pool here)")


class _Compiled:
    """One hot route's handler: what FastAPI would work out per request (its
    parameters, their fields, the caller's dependencies), worked out once."""

    def __init__(self, route: Any) -> None:
        dependant = route.dependant
        self.where = where = f"{sorted(route.methods or ())} {route.path}"
        _check_supported(route, where)
        self.callers = _callers(dependant, where)
        self.endpoint: Callable[..., Any] = route.endpoint
        # The field FastAPI validates a single, not embedded body with.
        self.body_field = dependant.body_params[0] if dependant.body_params else None
        self.request_name = dependant.request_param_name
        self.path_params = _params(dependant.path_params, "path", where)
        self.query_params = _params(dependant.query_params, "query", where)
        self.header_params = _params(dependant.header_params, "header", where)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        body = b""
        if self.body_field is not None:
            read = await _read_body(receive)
            if read is None:  # the client went away mid-body: nobody to answer
                return
            body = read
        try:
            response = await self.answer(scope, body)
        except DomainError as err:
            response = _Problem(err)
        await response(scope, _replay(body, receive), send)

    async def answer(self, scope: Scope, body: bytes) -> Response | _Problem:
        data: Any = _MISSING
        if body:
            if is_json(scope):
                try:
                    data = read_json(body)
                except JsonRefused:
                    refusal = json_refusal(body)
                    assert refusal is not None
                    return refusal
            else:  # FastAPI validates such a body as the bytes it is: a 422
                data = body
        request = Request(scope)
        request._body = body  # what the endpoint's `await request.body()` reads
        kwargs: dict[str, Any] = {}
        for caller in self.callers:
            kwargs[caller.name] = principal = await current_principal(
                request, request.headers.get("authorization")
            )
            if caller.roles is not None:
                await caller.roles(principal)
        errors = self.read_params(scope, request, data, kwargs)
        if errors:
            return _Problem(validation_error("the request is not valid", jsonable_errors(errors)))
        if self.request_name is not None:
            kwargs[self.request_name] = request
        response = await self.endpoint(**kwargs)
        if not isinstance(response, Response):
            raise TypeError(f"{self.where}: a hot route's endpoint must return a Response")
        return response

    def read_params(
        self, scope: Scope, request: Request, data: Any, kwargs: dict[str, Any]
    ) -> list[Any]:
        """Validates path, query, header and body into ``kwargs``, in FastAPI's
        order; returns every error found."""
        errors: list[Any] = []
        if self.path_params:
            path = scope.get("path_params", {})
            for param in self.path_params:
                param.read(path, kwargs, errors)
        if self.query_params:
            # Starlette's QueryParams, without its multi-dict: the last value
            # of a repeated name, as its get() answers.
            query = dict(parse_qsl(scope["query_string"].decode("latin-1"), keep_blank_values=True))
            for param in self.query_params:
                param.read(query, kwargs, errors)
        if self.header_params:
            headers = request.headers
            for param in self.header_params:
                param.read(headers, kwargs, errors)
        if self.body_field is not None:
            if data is _MISSING:
                errors.append(_BODY_MISSING)
            else:
                value, found = self.body_field.validate(data, {}, loc=("body",))
                if found:
                    errors.extend(found)
                else:
                    kwargs[self.body_field.name] = value
        return errors


@dataclass(frozen=True, slots=True)
class HotRoute:
    """A hot route as the app serves it: ``route`` is what the router writes
    into ``scope["route"]`` (the APIRoute: the metrics read its path), ``served``
    what it resolved it to (its full path's pattern, its methods), ``app`` the
    compiled handler both reach."""

    route: APIRoute
    served: Any
    app: ASGIApp


def hot_routes(app: FastAPI, endpoints: Sequence[Callable[..., Any]]) -> list[HotRoute]:
    """The app's routes of those endpoints, each now served by its compiled app
    (through the stack too). Call once every router is included: FastAPI
    resolves an included router's routes once per inclusion, and keeps them
    until that router changes. Every endpoint must have a route of the app."""
    wanted = set(endpoints)
    found: list[HotRoute] = []
    for ctx in iter_route_contexts(list(app.router.routes)):
        route = ctx.original_route
        if isinstance(route, APIRoute) and route.endpoint in wanted:
            # An included router's route is served through its context's app.
            served = ctx._route_context or route
            served.app = compiled = compile_route(served)
            found.append(HotRoute(route, served, compiled))
    missing = wanted - {h.route.endpoint for h in found}
    if missing:
        names = sorted(getattr(e, "__qualname__", repr(e)) for e in missing)
        raise ValueError(f"hot endpoints without a route of the app: {names}")
    return found


class HotLayer:
    """``HotLayer(stack, routes, fastapi_app, max_body_bytes)``: the hot routes'
    requests straight to their compiled app, every other request (and scope
    type) to ``stack``, the FastAPI app's own entry (its middleware stack)."""

    def __init__(
        self, stack: ASGIApp, routes: Sequence[HotRoute], fastapi_app: FastAPI, max_body_bytes: int
    ) -> None:
        self.app = stack
        self.fastapi_app = fastapi_app
        self.max_body_bytes = max_body_bytes
        self._routes: dict[str, list[HotRoute]] = {}
        for hot in routes:
            for method in hot.served.methods or ():
                self._routes.setdefault(method, []).append(hot)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        candidates = self._routes.get(scope.get("method", "")) if scope["type"] == "http" else None
        if candidates:
            path = scope["path"]
            for hot in candidates:
                m = hot.served.path_regex.match(path)
                if m is not None:
                    if hot.served.dependant.body_params and not _sized_within(
                        scope, self.max_body_bytes
                    ):
                        break  # unsized, oversized or odd: the body limit's call
                    await self._serve(scope, receive, send, hot, m.groupdict())
                    return
        await self.app(scope, receive, send)

    async def _serve(
        self, scope: Scope, receive: Receive, send: Send, hot: HotRoute, params: dict[str, str]
    ) -> None:
        started = time.perf_counter()
        method = scope["method"]
        # What the application and its router would have written.
        scope["app"] = self.fastapi_app
        scope["route"] = route = hot.route
        scope["path_params"] = params
        status = 500

        async def observe(message: Message) -> None:
            nonlocal status
            if message["type"] == "http.response.start":
                status = message["status"]
            await send(message)

        try:
            await hot.app(scope, receive, observe)
        except Exception as exc:
            # As the app's error middleware does: the 500, then the exception to
            # the server, which logs it.
            await unexpected_error(exc)(scope, receive, send)
            raise
        finally:
            REQUEST_METRICS.observe(method, route.path, status, time.perf_counter() - started)


class _Problem:
    """``problem(err)`` as the two ASGI messages Starlette's JSONResponse sends
    for it (same bytes, same headers in the same order), without building the
    Response: its header handling and the standard library's JSON encoder were
    a visible share of a refused booking's CPU (orjson writes the same compact
    JSON with raw UTF-8). A problem without extras (a storm's thousands of
    ``slot_full``) is rendered once and its bytes reused."""

    __slots__ = ("body", "headers", "status")

    def __init__(self, err: DomainError) -> None:
        key = None if err.extra else (err.status, err.code, err.detail, *err.headers.items())
        rendered = _RENDERED.get(key) if key is not None else None
        if rendered is None:
            rendered = _render(err)
            if key is not None:
                if len(_RENDERED) >= _RENDERED_MAX:
                    _RENDERED.clear()  # a few codes repeat; anything else is rare
                _RENDERED[key] = rendered
        self.status = err.status
        self.headers, self.body = rendered

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        # Fresh messages: what is sent may be changed on its way out.
        await send(
            {"type": "http.response.start", "status": self.status, "headers": [*self.headers]}
        )
        await send({"type": "http.response.body", "body": self.body})


def _render(err: DomainError) -> tuple[tuple[tuple[bytes, bytes], ...], bytes]:
    body = orjson.dumps(err.problem())
    raw = [(k.lower().encode("latin-1"), v.encode("latin-1")) for k, v in err.headers.items()]
    raw.append((b"content-length", str(len(body)).encode("latin-1")))
    raw.append((b"content-type", PROBLEM_JSON.encode("latin-1")))
    return tuple(raw), body


# Rendered problems by (status, code, detail, headers), for those without extras.
_RENDERED: dict[Any, tuple[tuple[tuple[bytes, bytes], ...], bytes]] = {}
_RENDERED_MAX = 512


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
