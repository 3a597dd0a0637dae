"""Domain errors with stable codes, and their HTTP rendering as problem+json.

Two tables, both filled once by the composition root from what each module
declares (its ``errors.py``, through its ``setup``): code -> HTTP status, and
constraint name -> (code, detail). Core's own codes are in ``CORE_CODES``.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import Any, TypeVar

import asyncpg

V = TypeVar("V")
PROBLEM_JSON = "application/problem+json"
# The status of a code nobody declared: a refusal of the request's intent.
DEFAULT_STATUS = 409

# The codes core raises, and the ones several modules share.
CORE_CODES: dict[str, int] = {
    "validation_error": 422,
    "unauthenticated": 401,
    "forbidden": 403,
    "bad_signature": 401,
    "not_found": 404,
    "rate_limited": 429,
    "unavailable": 503,
    # Rows a write needs stayed locked against it (a deadlock, retried, came back
    # each time): a passing condition like 503 unavailable, so an Idempotency-Key
    # stores nothing and a retry runs again.
    "contention": 503,
    "idempotency_key_required": 400,
    "idempotency_key_reused": 422,
    "request_in_progress": 409,
    "payload_too_large": 413,
    # A JSON body naming one key twice in one object (core/http/schemas.py).
    "duplicate_key": 422,
    "request_timeout": 408,  # the HTTP server: a slow client (core/http/slow_clients.py)
    "headers_too_large": 431,  # the HTTP server: request line and headers too large
    "bad_request": 400,  # the HTTP server: a request its parser refuses
    "http_version_not_supported": 505,  # the HTTP server: not HTTP/1.0 or HTTP/1.1
    "not_replayable": 409,
    "not_cancellable": 409,  # rentals bookings and scheduler jobs
    # The framework's own answers (core/http/problems.py): a known path, another method;
    # any other HTTP error; an exception nobody expected.
    "method_not_allowed": 405,
    "http_error": 400,
    "internal_error": 500,
}

_STATUS_BY_CODE: dict[str, int] = dict(CORE_CODES)
# constraint name -> (code, detail). Read by translate().
_CONSTRAINT_ERRORS: dict[str, tuple[str, str]] = {}


def register(
    codes: Mapping[str, int], constraints: Mapping[str, tuple[str, str]] | None = None
) -> None:
    """Add a module's codes and constraint names (the composition root calls this
    for every module). Registering the same entry twice is harmless; giving a
    code another status, or a constraint another error, is a wiring bug."""
    _merge(_STATUS_BY_CODE, codes)
    _merge(_CONSTRAINT_ERRORS, constraints or {})


def _merge(table: dict[str, V], new: Mapping[str, V]) -> None:
    clash = sorted(k for k, v in new.items() if table.get(k, v) != v)
    if clash:
        raise ValueError(f"declared twice, differently: {', '.join(clash)}")
    table.update(new)


def status_of(code: str) -> int:
    return _STATUS_BY_CODE.get(code, DEFAULT_STATUS)


class DomainError(Exception):
    """An expected refusal. ``code`` is part of the public contract; its status
    comes from the table unless one use of the code needs another."""

    def __init__(
        self,
        code: str,
        detail: str = "",
        *,
        status: int | None = None,
        headers: dict[str, str] | None = None,
        extra: dict[str, Any] | None = None,
    ) -> None:
        super().__init__(detail or code)
        self.code = code
        self.detail = detail or code.replace("_", " ")
        self.status = status or status_of(code)
        self.headers = headers or {}
        self.extra = extra or {}

    def problem(self) -> dict[str, Any]:
        return problem_body(self.status, self.code, self.detail, **self.extra)


# Where an issue is (the first item of its ``loc``), as the framework's own 422s
# name it; ``request`` when no part of the request can be named (a value the
# database refused, core/db/database.py).
ISSUE_PLACES = ("body", "query", "path", "header", "request")


def issue(loc: Sequence[str | int], msg: str, kind: str = "value_error") -> dict[str, Any]:
    """One item of a 422's ``errors``: ``loc`` starts with one of ISSUE_PLACES."""
    if not loc or loc[0] not in ISSUE_PLACES:
        raise ValueError(f"an issue's loc starts with one of {ISSUE_PLACES}: {loc!r}")
    return {"loc": [str(p) for p in loc], "msg": msg, "type": kind}


def model_issues(errors: Iterable[Mapping[str, Any]], *prefix: str) -> list[dict[str, Any]]:
    """A model's validation errors (pydantic's ``exc.errors()``) as issues, each
    ``loc`` under ``prefix`` (``"body"``, ``"body", "payload"``): the model read a
    part of the request, and its own loc starts inside that part."""
    return [
        issue([*prefix, *e.get("loc", ())], str(e.get("msg", "")), str(e.get("type", "")))
        for e in errors
    ]


def validation_error(
    detail: str,
    errors: list[dict[str, Any]] | None = None,
    *,
    at: Sequence[str | int] = ("body",),
    code: str = "validation_error",
) -> DomainError:
    """A 422 whose body lists what was wrong (``errors``: loc, msg, type, made by
    ``issue``), like the one the framework answers for a request that does not
    parse. Never an empty list: without ``errors``, one issue at ``at`` says
    ``detail``."""
    return DomainError(code, detail, status=422, extra={"errors": errors or [issue(at, detail)]})


# Where a problem type's page is served (app.py): a relative URI reference, so
# it resolves against whichever host the client called.
PROBLEM_PAGES = "/problems/"


def problem_type(code: str) -> str:
    return PROBLEM_PAGES + code


def problem_title(code: str) -> str:
    """The problem's name ("Slot full"), not the HTTP reason phrase: the status
    says that already, and several problems share one status."""
    return code.replace("_", " ").capitalize()


def declared_codes() -> dict[str, int]:
    """Every declared code and its status (core's and the registered modules')."""
    return dict(_STATUS_BY_CODE)


def problem_body(status: int, code: str, detail: str, **extra: Any) -> dict[str, Any]:
    body: dict[str, Any] = {
        "type": problem_type(code),
        "title": problem_title(code),
        "status": status,
        "detail": detail,
        "code": code,
    }
    body.update(extra)
    return body


def translate(exc: asyncpg.IntegrityConstraintViolationError) -> DomainError | None:
    """The single place where a refused write becomes a domain error."""
    name = getattr(exc, "constraint_name", None)
    if name and name in _CONSTRAINT_ERRORS:
        code, detail = _CONSTRAINT_ERRORS[name]
        return DomainError(code, detail)
    return None
