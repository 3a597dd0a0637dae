"""Answers a route builds: JSON already serialised, JSON from a value, a
response model filled from a domain object."""

from __future__ import annotations

from typing import Any, TypeVar

from fastapi.responses import JSONResponse, Response
from pydantic import BaseModel

from reservo.core.kernel.errors import PROBLEM_JSON


def json_bytes(status: int, body: bytes, headers: dict[str, str] | None = None) -> Response:
    """A response with already-serialised JSON, typed like ``json_response``."""
    media = PROBLEM_JSON if status >= 400 else "application/json"
    return Response(body, status_code=status, media_type=media, headers=headers)


def json_response(status: int, body: Any) -> JSONResponse:
    media = PROBLEM_JSON if status >= 400 else "application/json"
    return JSONResponse(body, status_code=status, media_type=media)


M = TypeVar("M", bound=BaseModel)


def model_from(model: type[M], source: object, **given: Any) -> M:
    """A response ``model`` whose fields are ``source``'s attributes of the same
    names, but for the ``given`` ones (renamed or computed): what a domain object
    shows on the wire, without restating every field. Validated as the
    constructor validates, so the wire JSON is the constructor's."""
    taken = {name: getattr(source, name) for name in model.model_fields if name not in given}
    return model.model_validate({**taken, **given})
