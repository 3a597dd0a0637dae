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

- reads the body (the JSON intake has refused what its rules refuse, and kept
  the document it read: core/http/json_intake.py);
- authenticates with the same dependency (``current_principal``, a ``Roles``
  rule), in the declaration's order, so a 401/403 comes before any 422;
- validates the path, query and header parameters and the body with the
  route's own pydantic fields (pydantic-core), collecting FastAPI's errors, and
  answers them as the app's validation handler does;
- calls the endpoint with those arguments and sends the Response it returns;
  a ``DomainError`` is rendered by the same ``problem()`` as everywhere.

``HotRouter``, the innermost step of the request pipeline (core/http/pipeline.py),
hands a hot route's request to that app, and every other request to FastAPI's
own entry, whose router reaches the same app. Every request has passed the
same concerns by then (metrics, body limit, JSON intake, ...): there is one
path, and one implementation per route.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable, Sequence
from copy import deepcopy
from dataclasses import dataclass
from typing import Any, cast
from urllib.parse import parse_qsl

import orjson
from fastapi import FastAPI, Request
from fastapi.routing import APIRoute
from pydantic import ValidationError
from starlette.responses import Response
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from reservo.core.http.body_limit import BodyTooLarge
from reservo.core.http.callers import Roles, current_principal, principal_of
from reservo.core.http.fastapi_adapter import (
    Dependant,
    ModelField,
    api_routes,
    embeds_body,
    is_single_valued,
    request_aliases,
)
from reservo.core.http.json_intake import JSON_DOCUMENT, is_json_media, refused_json
from reservo.core.http.problems import jsonable_errors, unexpected_error
from reservo.core.http.schemas import WALKED, ApiModel, JsonRefused, read_json
from reservo.core.kernel.errors import PROBLEM_JSON, DomainError, validation_error

_MISSING = object()


def missing_error(loc: tuple[str, ...]) -> dict[str, Any]:
    """FastAPI's error for a required parameter the request lacks."""
    return {"type": "missing", "loc": loc, "msg": "Field required", "input": None}


# What FastAPI answers for a required body that was not sent.
_BODY_MISSING = {"type": "missing", "loc": ("body",), "msg": "Field required"}


@dataclass(frozen=True, slots=True)
class _Caller:
    """A dependency of the endpoint: the verified caller, under ``name``, held
    to ``roles`` when the declaration names a ``Roles`` rule."""

    name: str
    roles: Roles | None


class _Param:
    """A path, query or header parameter as ``request_params_to_args`` reads
    it, its aliases, location, requiredness and default worked out once: the
    first alias the request has (else the first), its value validated by the
    parameter's own field. A header's aliases are also kept as the raw
    lower-case names the ASGI scope carries."""

    __slots__ = (
        "aliases",
        "default",
        "factory",
        "field",
        "name",
        "raw",
        "required",
        "validate_default",
        "where",
    )

    def __init__(self, field: ModelField, aliases: tuple[str, ...], where: str) -> None:
        self.field = field
        self.name = field.name
        self.aliases = aliases
        self.raw = tuple(a.lower().encode("latin-1") for a in aliases)
        self.where = where
        info = field.field_info
        self.required = info.is_required()
        # A factory's default is made afresh per request, as FastAPI's field does.
        self.factory = info.default_factory is not None
        self.default = None if self.required or self.factory else field.get_default()
        self.validate_default = bool(info.validate_default)

    def read(self, source: Any, values: dict[str, Any], errors: list[Any]) -> None:
        alias = self.aliases[0]
        if len(self.aliases) > 1:
            alias = next((a for a in self.aliases if a in source), alias)
        self.take(source.get(alias), alias, values, errors)

    def read_header(
        self, headers: dict[bytes, bytes], values: dict[str, Any], errors: list[Any]
    ) -> None:
        index = 0
        if len(self.raw) > 1:
            index = next((i for i, a in enumerate(self.raw) if a in headers), 0)
        raw = headers.get(self.raw[index])
        value = None if raw is None else raw.decode("latin-1")
        self.take(value, self.aliases[index], values, errors)

    def take(self, value: Any, alias: str, values: dict[str, Any], errors: list[Any]) -> None:
        """``_validate_value_with_model_field``'s work, its checks made once."""
        loc = (self.where, alias)
        if value is None:
            if self.required:
                errors.append(missing_error(loc))
                return
            value = deepcopy(self.field.get_default() if self.factory else self.default)
            if not self.validate_default:
                values[self.name] = value
                return
        value, found = self.field.validate(value, values, loc=loc)
        if found:
            errors.extend(found)
        else:
            values[self.name] = value


def _params(fields: Sequence[ModelField], where: str, route: str) -> list[_Param]:
    out = []
    for field in fields:
        if not is_single_valued(field):
            raise ValueError(f"{route}: only single-valued parameters are supported")
        out.append(_Param(field, request_aliases(field), where))
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


def compile_route(route: Any) -> _Compiled:
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
    if dependant.body_params and embeds_body(route):
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


class _Body:
    """A route's body decoder, built at registration: the intake rules'
    reading (``read_json``, which walks the document), then the body's field.
    A body that is an ApiModel is validated by the model itself with the
    ``WALKED`` context, so its own walk of the same document is skipped (the
    walk was the largest part of a small body's cost); any other annotation
    by FastAPI's field, as FastAPI would. Errors carry FastAPI's ``("body",
    ...)`` locations either way."""

    __slots__ = ("field", "model", "name")

    def __init__(self, field: ModelField) -> None:
        self.field = field
        self.name = field.name
        annotation = field.field_info.annotation
        plain = not field.field_info.metadata
        self.model = (
            annotation
            if plain and isinstance(annotation, type) and issubclass(annotation, ApiModel)
            else None
        )

    def validate(self, data: Any, kwargs: dict[str, Any], errors: list[Any]) -> None:
        if data is _MISSING:
            errors.append(_BODY_MISSING)
            return
        if self.model is None:
            value, found = self.field.validate(data, {}, loc=("body",))
            if found:
                errors.extend(found)
            else:
                kwargs[self.name] = value
            return
        try:
            # from_attributes as FastAPI's field validates: same answers to any input.
            kwargs[self.name] = self.model.model_validate(
                data, from_attributes=True, context={WALKED: data}
            )
        except ValidationError as exc:
            errors.extend(
                {**e, "loc": ("body", *e.get("loc", ()))} for e in exc.errors(include_url=False)
            )


class _Compiled:
    """One hot route's handler: what FastAPI would work out per request (its
    parameters, their fields, the caller's dependencies, the headers it reads),
    worked out once. Headers are read straight from the scope's list (one
    pass, only the names the route uses, the first of a repeated name as
    Starlette's ``Headers.get``); a Request is built only for an endpoint that
    takes one."""

    def __init__(self, route: Any) -> None:
        dependant = route.dependant
        self.where = where = f"{sorted(route.methods or ())} {route.path}"
        _check_supported(route, where)
        self.callers = _callers(dependant, where)
        self.endpoint: Callable[..., Any] = route.endpoint
        # The field FastAPI validates a single, not embedded body with.
        self.body = _Body(dependant.body_params[0]) if dependant.body_params else None
        self.request_name = dependant.request_param_name
        self.path_params = _params(dependant.path_params, "path", where)
        self.query_params = _params(dependant.query_params, "query", where)
        self.header_params = _params(dependant.header_params, "header", where)
        wanted = {raw for param in self.header_params for raw in param.raw}
        if self.callers:
            wanted.add(_AUTHORIZATION)
        if self.body is not None:
            wanted.add(_CONTENT_TYPE)
        self.wanted = frozenset(wanted)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        body = b""
        if self.body is not None:
            read = await _read_body(receive)
            if read is None:  # the client went away mid-body: nobody to answer
                return
            body = read
        try:
            response = await self.answer(scope, body)
        except DomainError as err:
            response = _Problem(err)
        if isinstance(response, _Problem):
            await response(scope, receive, send)
        else:
            await response(scope, _replay(body, receive), send)

    async def answer(self, scope: Scope, body: bytes) -> Response | _Problem:
        headers = _headers(scope["headers"], self.wanted) if self.wanted else {}
        kwargs: dict[str, Any] = {}
        # The caller first, as FastAPI solves it before the body is used: a
        # request without a valid token is 401 whatever its body.
        if self.callers:
            raw = headers.get(_AUTHORIZATION)
            authorization = None if raw is None else raw.decode("latin-1")
            state = scope["app"].state
            for caller in self.callers:
                kwargs[caller.name] = principal = await principal_of(state, authorization)
                if caller.roles is not None:
                    caller.roles.check(principal)
        data: Any = _MISSING
        if body:
            if is_json_media(headers.get(_CONTENT_TYPE)):
                # The JSON intake has read it already (the document it kept);
                # read here when the route is reached another way (a test's).
                data = scope.get(JSON_DOCUMENT, _MISSING)
                if data is _MISSING:
                    try:
                        data = read_json(body)
                    except JsonRefused as exc:
                        return _Problem(refused_json(exc))
            else:  # FastAPI validates such a body as the bytes it is: a 422
                data = body
        errors = self.read_params(scope, headers, data, kwargs)
        if errors:
            return _Problem(validation_error("the request is not valid", jsonable_errors(errors)))
        if self.request_name is not None:
            request = Request(scope)
            request._body = body  # what the endpoint's `await request.body()` reads
            kwargs[self.request_name] = request
        response = await self.endpoint(**kwargs)
        if not isinstance(response, Response):
            raise TypeError(f"{self.where}: a hot route's endpoint must return a Response")
        return response

    def read_params(
        self, scope: Scope, headers: dict[bytes, bytes], data: Any, kwargs: dict[str, Any]
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
        for param in self.header_params:
            param.read_header(headers, kwargs, errors)
        if self.body is not None:
            self.body.validate(data, kwargs, errors)
        return errors


_AUTHORIZATION = b"authorization"
_CONTENT_TYPE = b"content-type"


def _headers(raw: Sequence[tuple[bytes, bytes]], wanted: frozenset[bytes]) -> dict[bytes, bytes]:
    """The ``wanted`` headers of a scope's list, each its first value (what
    Starlette's ``Headers.get`` answers: ASGI names are lower-case)."""
    found: dict[bytes, bytes] = {}
    for name, value in raw:
        if name in wanted and name not in found:
            found[name] = value
    return found


@dataclass(frozen=True, slots=True)
class HotRoute:
    """A hot route as the app serves it: ``route`` is what the router writes
    into ``scope["route"]`` (the APIRoute: the metrics read its path), ``served``
    what it resolved it to (its full path's pattern, its methods), ``app`` the
    compiled handler both reach."""

    route: APIRoute
    served: Any
    app: _Compiled


def hot_routes(app: FastAPI, endpoints: Sequence[Callable[..., Any]]) -> list[HotRoute]:
    """The app's routes of those endpoints, each now served by its compiled app
    (through the stack too). Call once every router is included: FastAPI
    resolves an included router's routes once per inclusion, and keeps them
    until that router changes. Every endpoint must have a route of the app."""
    wanted = set(endpoints)
    found: list[HotRoute] = []
    for route, served in api_routes(app):
        if route.endpoint in wanted:
            # An included router's route is served through its context's app.
            compiled = compile_route(served)
            # The router awaits it as an ASGI app (the status it returns is ignored there).
            served.app = cast(ASGIApp, compiled)
            found.append(HotRoute(route, served, compiled))
    missing = wanted - {h.route.endpoint for h in found}
    if missing:
        names = sorted(getattr(e, "__qualname__", repr(e)) for e in missing)
        raise ValueError(f"hot endpoints without a route of the app: {names}")
    return found


class HotRouter:
    """``HotRouter(app_entry, routes, fastapi_app)``: the innermost step of the
    request pipeline (core/http/pipeline.py), where routing happens. A request
    for a hot route goes to its compiled app, every other request (and scope
    type) to ``app_entry``, FastAPI's own (its error middleware, exception
    handlers and router, which reaches the same compiled apps). Either way the
    request has passed every concern of the pipeline first."""

    def __init__(
        self, app_entry: ASGIApp, routes: Sequence[HotRoute], fastapi_app: FastAPI
    ) -> None:
        self.app = app_entry
        self.fastapi_app = fastapi_app
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
                    await self._serve(scope, receive, send, hot, m.groupdict())
                    return
        await self.app(scope, receive, send)

    async def _serve(
        self, scope: Scope, receive: Receive, send: Send, hot: HotRoute, params: dict[str, str]
    ) -> None:
        # What the application and its router would have written (the metrics
        # read the route's template from it).
        scope["app"] = self.fastapi_app
        scope["route"] = hot.route
        scope["path_params"] = params
        try:
            await hot.app(scope, receive, send)
        except BodyTooLarge:
            raise  # the body limit's to answer (413)
        except Exception as exc:
            # As the app's error middleware does: the 500, then the exception to
            # the server, which logs it.
            await unexpected_error(exc)(scope, receive, send)
            raise


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
