"""problem+json answers (RFC 9457) for every error a route or the framework
raises: domain refusals, validation errors, unknown paths and methods, the 500
of an exception nobody expected."""

from __future__ import annotations

from typing import Any

import structlog
from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException as StarletteHTTPException

from reservo.core.http.body_limit import BodyTooLarge
from reservo.core.http.methods import allow_of
from reservo.core.kernel.errors import PROBLEM_JSON, DomainError, problem_body, validation_error

log = structlog.get_logger(__name__)


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
    @app.exception_handler(BodyTooLarge)
    async def _cut_off(_: Request, exc: BodyTooLarge) -> JSONResponse:
        # A body cut off by the limit while a route read it: the limit sends its
        # own 413 instead of this answer (core/http/body_limit.py), which keeps
        # the cut from reaching the error middleware as an unexpected error.
        return problem(DomainError("payload_too_large", "the request body is too large"))

    @app.exception_handler(DomainError)
    async def _domain(_: Request, exc: DomainError) -> JSONResponse:
        return problem(exc)

    @app.exception_handler(RequestValidationError)
    async def _validation(_: Request, exc: RequestValidationError) -> JSONResponse:
        errors = jsonable_errors(list(exc.errors()))
        return problem(validation_error("the request is not valid", errors))

    @app.exception_handler(StarletteHTTPException)
    async def _http(request: Request, exc: StarletteHTTPException) -> JSONResponse:
        code = {404: "not_found", 405: "method_not_allowed", 413: "payload_too_large"}.get(
            exc.status_code, "http_error"
        )
        headers = dict(getattr(exc, "headers", None) or {})
        if exc.status_code == 405:
            # The router's Allow names the methods of the one route it tried.
            allow = allow_of(request)
            if allow is not None:
                headers["Allow"] = allow
        return JSONResponse(
            problem_body(exc.status_code, code, str(exc.detail)),
            status_code=exc.status_code,
            media_type=PROBLEM_JSON,
            headers=headers or None,
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
