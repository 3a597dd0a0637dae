"""Domain errors with stable codes, and their HTTP rendering as problem+json.

One table maps codes to statuses; one registry maps constraint names to codes.
"""

from __future__ import annotations

from typing import Any, ClassVar

import asyncpg

PROBLEM_JSON = "application/problem+json"


class DomainError(Exception):
    """An expected refusal. ``code`` is part of the public contract."""

    status_by_code: ClassVar[dict[str, int]] = {
        "validation_error": 422,
        "unauthenticated": 401,
        "forbidden": 403,
        "bad_signature": 401,
        "not_found": 404,
        "rate_limited": 429,
        "unavailable": 503,
        "idempotency_key_required": 400,
        "idempotency_key_reused": 422,
        "request_in_progress": 409,
        "payload_too_large": 413,
    }

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
        self.status = status or self.status_by_code.get(code, 409)
        self.headers = headers or {}
        self.extra = extra or {}

    @classmethod
    def register(cls, codes: dict[str, int]) -> None:
        """Modules declare their codes once, at import time."""
        cls.status_by_code.update(codes)

    def problem(self) -> dict[str, Any]:
        return problem_body(self.status, self.code, self.detail, **self.extra)


def problem_body(status: int, code: str, detail: str, **extra: Any) -> dict[str, Any]:
    from http import HTTPStatus

    try:
        title = HTTPStatus(status).phrase
    except ValueError:
        title = "Error"
    body: dict[str, Any] = {
        "type": f"https://reservo.dev/problems/{code.replace('_', '-')}",
        "title": title,
        "status": status,
        "detail": detail,
        "code": code,
    }
    body.update(extra)
    return body


# constraint name -> (code, detail). Filled by modules; read by translate().
_CONSTRAINT_ERRORS: dict[str, tuple[str, str]] = {}


def register_constraints(mapping: dict[str, tuple[str, str]]) -> None:
    _CONSTRAINT_ERRORS.update(mapping)


def translate(exc: asyncpg.IntegrityConstraintViolationError) -> DomainError | None:
    """The single place where a refused write becomes a domain error."""
    name = getattr(exc, "constraint_name", None)
    if name and name in _CONSTRAINT_ERRORS:
        code, detail = _CONSTRAINT_ERRORS[name]
        return DomainError(code, detail)
    return None
