"""Every FastAPI internal the hot routes (core/http/hotroute.py) read, in one
place. FastAPI has no public API for a route's parsed declaration (its
``Dependant``, its fields' request aliases, the context an included router's
route is served through), so compiling a route from its declaration needs
these; each is named here once, and tests/unit/test_fastapi_adapter.py holds
them to what the hot routes expect and to the FastAPI version they were
checked against (``VERIFIED``; pyproject.toml allows that minor version only).
A FastAPI upgrade fails that test first: check each function below against
the new version, then move ``VERIFIED`` and the pin together."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from fastapi import FastAPI
from fastapi._compat import ModelField, field_annotation_is_sequence
from fastapi.dependencies.models import Dependant
from fastapi.dependencies.utils import _get_param_aliases, _get_param_model, _is_json_field
from fastapi.routing import APIRoute, iter_route_contexts

# The FastAPI minor version every function here was checked against.
VERIFIED = "0.165"

__all__ = [
    "VERIFIED",
    "Dependant",
    "ModelField",
    "api_routes",
    "embeds_body",
    "is_single_valued",
    "request_aliases",
]


def api_routes(app: FastAPI) -> Iterator[tuple[APIRoute, Any]]:
    """Every APIRoute of the app, included routers' too, with what serves it:
    the route itself, or for an included router's route the context FastAPI
    resolved it to (its full path's pattern, methods, dependant and ``app``)."""
    for ctx in iter_route_contexts(list(app.router.routes)):
        route = ctx.original_route
        if isinstance(route, APIRoute):
            yield route, ctx._route_context or route


def request_aliases(field: ModelField) -> tuple[str, ...]:
    """The names a path, query or header parameter is looked up under in the
    request, in FastAPI's order of preference."""
    return tuple(request for _, request in _get_param_aliases(field))


def is_single_valued(field: ModelField) -> bool:
    """False for what reads several values or a model out of the request: a
    parameter model, a ``Json`` field, a sequence."""
    return not (
        _get_param_model(field) is not None
        or _is_json_field(field)
        or field_annotation_is_sequence(field.field_info.annotation)
    )


def embeds_body(route: Any) -> bool:
    """Whether the route's body fields are read as members of one object."""
    return bool(route._embed_body_fields)
