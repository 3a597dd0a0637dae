"""The OpenAPI document a client generator can trust, finished from what the code
declares: each route names the error codes its own code path raises
(``openapi_extra=raises(...)``); the ones every route of a kind can answer
(who may call it, its parameters, its Idempotency-Key) are read from its
dependencies; each code's status comes from the table DomainError takes it from
(core/kernel/errors.py). Nothing here runs per request: the document is built once,
when first asked for."""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from html import escape
from importlib.resources import files
from typing import Annotated, Any

import structlog
from fastapi import FastAPI
from fastapi.dependencies.models import Dependant
from fastapi.openapi.docs import get_redoc_html, get_swagger_ui_html
from fastapi.responses import HTMLResponse
from fastapi.routing import APIRoute, RouteContext, iter_route_contexts
from pydantic import BaseModel, Field
from starlette.routing import BaseRoute
from starlette.staticfiles import StaticFiles

from reservo.core.http.callers import Roles, current_principal
from reservo.core.http.idempotent import IDEMPOTENCY_HEADER, KEY_REQUIRED
from reservo.core.http.schemas import MAX_ID
from reservo.core.kernel.errors import (
    ISSUE_PLACES,
    PROBLEM_JSON,
    PROBLEM_PAGES,
    DomainError,
    declared_codes,
    problem_body,
    problem_title,
    status_of,
)

log = structlog.get_logger(__name__)
# The route's own codes, in its `openapi_extra` (read and removed below).
RAISES = "x-raises"
# Named schemas an operation brings along (raw_body), moved to components.
SCHEMAS = "x-schemas"
BEARER = "bearerAuth"
# A signed webhook's caller proves itself by this header (core/http/auth.py).
SIGNATURE = "webhookSignature"
SIGNATURE_HEADER = "X-Signature"
_SIGNATURE_SCHEME = {
    "type": "apiKey",
    "in": "header",
    "name": SIGNATURE_HEADER,
    "description": (
        "`t=<unix seconds>,v1=<hex HMAC-SHA256>`: the MAC, keyed with the sender's "
        "shared secret, covers `<t>.` followed by the raw request body; a `t` more than "
        "300 s from the server's clock is refused."
    ),
}
# Where one of these statuses is sent, Retry-After says when to try again.
_RETRY_AFTER_CODES = frozenset(("rate_limited", "unavailable", "contention", "request_in_progress"))
_REPLAYED = "The stored answer to an earlier request with the same Idempotency-Key"
_KEY_SCHEMA = {"type": "string", "pattern": "^[\\x21-\\x7e]{1,255}$"}
_RETRY_AFTER = {
    "description": "Seconds to wait before trying again",
    "schema": {"type": "integer", "minimum": 0},
}


class ProblemIssue(BaseModel):
    """One thing wrong with a request (`errors` of a 422)."""

    loc: list[str] = Field(
        min_length=1,
        description=(
            "Where: `body`, `query`, `path` or `header`, then names (`request` alone: "
            "a value the database refused, which no part of the request names)"
        ),
        json_schema_extra={"prefixItems": [{"enum": list(ISSUE_PLACES)}]},
    )
    msg: str
    type: str = Field(description="What kind of issue, e.g. `missing`, `value_error`")


class Problem(BaseModel):
    """An RFC 9457 problem: every error answer of the API has this shape. `code`
    is stable and names the problem; `type` is the URI of its page."""

    type: str = Field(description="URI reference of the problem's page (`/problems/{code}`)")
    title: str = Field(description="The problem's name, e.g. `Slot full`")
    status: int
    detail: str = Field(description="What happened to this request, for a person")
    instance: str | None = None
    code: str = Field(description="Stable machine-readable code, e.g. `slot_full`")
    errors: Annotated[list[ProblemIssue], Field(min_length=1)] | None = Field(
        default=None, description="What was wrong (at least one issue), on a 422"
    )


def raises(*codes: str) -> dict[str, Any]:
    """A route's ``openapi_extra``: the problem codes its own code path raises
    (the ones its dependencies imply are added by ``finish``)."""
    return {RAISES: list(codes)}


def raw_body(model: type[BaseModel]) -> dict[str, Any]:
    """``openapi_extra`` of a route that reads its body raw (a signed webhook: the
    signature covers the bytes): the body's model, documented as a named schema
    as if FastAPI had parsed it, so a generator makes the same class of it."""
    schema = model.model_json_schema(ref_template="#/components/schemas/{model}")
    named = {**schema.pop("$defs", {}), model.__name__: schema}
    ref = {"$ref": f"#/components/schemas/{model.__name__}"}
    return {
        "requestBody": {"required": True, "content": {"application/json": {"schema": ref}}},
        SCHEMAS: named,
    }


def finish(doc: dict[str, Any], routes: Iterable[BaseRoute], api_prefix: str) -> dict[str, Any]:
    """Complete FastAPI's document in place: the security schemes, one Problem schema
    every error response refers to, each operation's own statuses and codes.
    Refuses (ValueError) an operation a reader could not place or understand:
    one without a description or with a tag the document does not declare."""
    components = doc.setdefault("components", {})
    schemas = components.setdefault("schemas", {})
    schemas.update(_problem_schemas())
    components["securitySchemes"] = {
        BEARER: {"type": "http", "scheme": "bearer", "bearerFormat": "JWT"},
        SIGNATURE: _SIGNATURE_SCHEME,
    }
    tags = _declared_tags(doc)
    seen: set[str] = set()
    answered: set[str] = set()
    for route in _documented(routes):
        for method in sorted(route.methods or ()):
            op = doc["paths"][route.path_format][method.lower()]
            schemas.update(op.pop(SCHEMAS, {}))
            answered |= _finish_operation(op, route, api_prefix)
            _unique_id(op, seen)
            _described(op, f"{method} {route.path_format}", tags)
    components["examples"] = _problem_examples(answered)
    for unused in ("HTTPValidationError", "ValidationError"):
        schemas.pop(unused, None)
    _exact_bounds(doc)
    return doc


# The schema keywords whose value is a number a generator compares with.
_BOUNDS = frozenset(("minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum", "multipleOf"))


def _exact_bounds(node: Any) -> None:
    """Each numeric bound written as the integer it is. FastAPI's document model
    holds bounds as floats: ``maximum: 9223372036854775807`` became
    ``9.223372036854776e+18``, which is 2**63, one past the largest id the
    service takes (a client or fuzzer trusting it sends ids the service
    refuses), and ``minimum: 1`` became ``1.0``. Only MAX_ID is that large."""
    if isinstance(node, dict):
        for key, value in node.items():
            if key in _BOUNDS and isinstance(value, float) and value.is_integer():
                node[key] = MAX_ID if value == float(MAX_ID) else int(value)
            else:
                _exact_bounds(value)
    elif isinstance(node, list):
        for item in node:
            _exact_bounds(item)


def _documented(routes: Iterable[BaseRoute]) -> Iterator[RouteContext]:
    """Every documented route as FastAPI documents it: an included router's
    routes are reached through their context (its prefix and dependencies)."""
    for ctx in iter_route_contexts(list(routes)):
        if isinstance(ctx.original_route, APIRoute) and ctx.include_in_schema:
            yield ctx


def _unique_id(op: dict[str, Any], seen: set[str]) -> None:
    op_id = op.get("operationId", "")
    # FastAPI's made-up ids carry the path in snake case: each route names its own.
    if "_" in op_id or not op_id[:1].islower():
        raise ValueError(f"operation {op_id!r} needs an operation_id such as 'bookAppointment'")
    if op_id in seen:
        raise ValueError(f"operationId {op_id!r} used twice")
    seen.add(op_id)


def _declared_tags(doc: dict[str, Any]) -> set[str]:
    names = set()
    for tag in doc.get("tags", ()):
        if not tag.get("description"):
            raise ValueError(f"tag {tag['name']!r} needs a description (TAGS in reservo/app.py)")
        names.add(tag["name"])
    return names


def _described(op: dict[str, Any], where: str, tags: set[str]) -> None:
    """An operation is found under a declared tag and says what it does."""
    name = f"operation {op.get('operationId')!r} ({where})"
    if not op.get("description", "").strip():
        raise ValueError(f"{name} needs a description: give its function a docstring")
    fix = "tag its router with one of TAGS in reservo/app.py (or add one there, described)"
    if not op.get("tags"):
        raise ValueError(f"{name} has no tag: {fix}")
    undeclared = [t for t in op["tags"] if t not in tags]
    if undeclared:
        raise ValueError(f"{name} has tag(s) {undeclared} the document does not declare: {fix}")


def _problem_schemas() -> dict[str, Any]:
    schema = Problem.model_json_schema(ref_template="#/components/schemas/{model}")
    defs = schema.pop("$defs", {})
    return {**defs, "Problem": schema}


def _finish_operation(op: dict[str, Any], route: RouteContext, api_prefix: str) -> set[str]:
    """Security, parameters and problem responses of one operation; its codes."""
    facts = _Facts(route.dependant)
    codes = set(op.pop(RAISES, ())) | facts.codes((route.path or "").startswith(api_prefix))
    if facts.authenticated:
        op["security"] = [{BEARER: []}]
    elif facts.signed:
        op["security"] = [{SIGNATURE: []}]
    else:
        # Said outright, so neither a reader nor a generator guesses a default.
        op["security"] = []
    for param in op.get("parameters", ()):
        if param.get("schema", {}).get(KEY_REQUIRED):
            param["required"] = True
            param["schema"] = _KEY_SCHEMA
    responses = op.setdefault("responses", {})
    for status in [s for s in responses if int(s) >= 400]:
        del responses[status]
    if facts.idempotent and "201" in responses:
        # A retry with the same key gets the stored answer again, as 200.
        responses["200"] = {**responses["201"], "description": _REPLAYED}
    by_status: dict[int, list[str]] = {}
    for code in sorted(codes):
        by_status.setdefault(status_of(code), []).append(code)
    for status, group in sorted(by_status.items()):
        responses[str(status)] = _problem_response(status, group)
    op["responses"] = dict(sorted(responses.items()))
    return codes


def _problem_response(status: int, codes: list[str]) -> dict[str, Any]:
    response: dict[str, Any] = {
        "description": ", ".join(f"`{code}`" for code in codes),
        "content": {
            PROBLEM_JSON: {
                "schema": {"$ref": "#/components/schemas/Problem"},
                # One example per code the operation can answer with this status.
                "examples": {c: {"$ref": f"#/components/examples/{c}"} for c in codes},
            }
        },
    }
    if _RETRY_AFTER_CODES.intersection(codes):
        response["headers"] = {"Retry-After": _RETRY_AFTER}
    return response


def _problem_examples(codes: Iterable[str]) -> dict[str, Any]:
    """components/examples: each code's problem body, once for every operation."""
    return {
        code: {
            "summary": problem_title(code),
            "value": problem_body(status_of(code), code, problem_title(code).lower()),
        }
        for code in sorted(codes)
    }


class _Facts:
    """What a route's dependencies say about the answers it can give."""

    def __init__(self, dependant: Dependant) -> None:
        calls = [d.call for d in _walk(dependant)]
        self.authenticated = current_principal in calls
        self.role_rule = any(isinstance(c, Roles) for c in calls)
        deps = list(_walk(dependant))
        self.has_body = any(d.body_params for d in deps)
        self.has_params = self.has_body or any(
            d.path_params or d.query_params or d.header_params for d in deps
        )
        self.idempotent = any(p.alias == IDEMPOTENCY_HEADER for d in deps for p in d.header_params)
        self.signed = any(p.alias == SIGNATURE_HEADER for d in deps for p in d.header_params)

    def codes(self, touches_database: bool) -> set[str]:
        out: set[str] = set()
        if self.authenticated:
            out.add("unauthenticated")
        if self.role_rule:
            out.add("forbidden")
        if self.has_params:
            out.add("validation_error")
        if self.has_body:
            out |= {"payload_too_large", "duplicate_key"}
        if self.idempotent:
            out |= {"idempotency_key_required", "idempotency_key_reused", "request_in_progress"}
        if touches_database:
            out.add("unavailable")
        return out


def _walk(dependant: Dependant) -> Iterator[Dependant]:
    stack = [dependant]
    while stack:
        dep = stack.pop()
        yield dep
        stack.extend(dep.dependencies)


# --- the pages: /docs and /redoc from packaged assets, /problems/{code} ----------------

# The HTML pages may not be framed by another site (clickjacking): both the
# modern and the legacy header, as browsers honour one or the other.
_NO_FRAMING = {"Content-Security-Policy": "frame-ancestors 'none'", "X-Frame-Options": "DENY"}
_ASSETS = "/docs/assets"


def install_pages(app: FastAPI, title: str) -> None:
    """Swagger UI at /docs and ReDoc at /redoc, their scripts served by this
    process from the `fastapi-offline` package (no CDN: they work on an
    air-gapped network), and a page per problem type."""
    assets = _assets_dir()
    if assets is None:
        log.warning("api_docs_unavailable", reason="the fastapi-offline package is not installed")
    else:
        app.mount(_ASSETS, StaticFiles(directory=assets), name="docs-assets")
        _docs_routes(app, title)

    @app.get(PROBLEM_PAGES + "{code}", include_in_schema=False, response_class=HTMLResponse)
    async def problem_page(code: str) -> HTMLResponse:
        status = declared_codes().get(code)
        if status is None:
            raise DomainError("not_found", f"no problem type {code}", status=404)
        return HTMLResponse(_problem_html(code, status, _raised_by(app.openapi(), code)))


def _assets_dir() -> str | None:
    try:
        return str(files("fastapi_offline") / "static")
    except ModuleNotFoundError:
        return None


def _docs_routes(app: FastAPI, title: str) -> None:
    openapi_url = app.openapi_url or "/openapi.json"

    @app.get("/docs", include_in_schema=False)
    async def swagger_ui() -> HTMLResponse:
        page = get_swagger_ui_html(
            openapi_url=openapi_url,
            title=f"{title} - Swagger UI",
            swagger_js_url=f"{_ASSETS}/swagger-ui-bundle.js",
            swagger_css_url=f"{_ASSETS}/swagger-ui.css",
            swagger_favicon_url=f"{_ASSETS}/favicon.png",
        )
        return HTMLResponse(page.body, headers=_NO_FRAMING)

    @app.get("/redoc", include_in_schema=False)
    async def redoc() -> HTMLResponse:
        page = get_redoc_html(
            openapi_url=openapi_url,
            title=f"{title} - ReDoc",
            redoc_js_url=f"{_ASSETS}/redoc.standalone.js",
            redoc_favicon_url=f"{_ASSETS}/favicon.png",
            with_google_fonts=False,
        )
        return HTMLResponse(page.body, headers=_NO_FRAMING)


def _raised_by(doc: dict[str, Any], code: str) -> list[str]:
    """The operations whose documented answers include ``code``."""
    out = []
    for template, operations in doc.get("paths", {}).items():
        for method, op in operations.items():
            for response in op.get("responses", {}).values():
                examples = response.get("content", {}).get(PROBLEM_JSON, {}).get("examples", {})
                if code in examples:
                    out.append(f"{op.get('operationId', '')} ({method.upper()} {template})")
    return sorted(out)


def _problem_html(code: str, status: int, raised_by: list[str]) -> str:
    title = escape(problem_title(code))
    where = "".join(f"<li><code>{escape(op)}</code></li>" for op in raised_by)
    return (
        f'<!doctype html><html><head><meta charset="utf-8"><title>{title}</title></head>'
        f"<body><h1>{title}</h1><p>Problem code <code>{escape(code)}</code>, "
        f"HTTP status {status}. The response's <code>detail</code> says what happened "
        f"to that request.</p><h2>Answered by</h2><ul>{where or '<li>any route</li>'}</ul>"
        "</body></html>"
    )
