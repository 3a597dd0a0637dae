"""Which methods a path's resource answers, for the 405s (RFC 9110 §15.5.6: the
``Allow`` of a 405 lists every method the target resource supports).

A resource is a path template with every route declared on it: the router sees
one route at a time, so its own 405 named the methods of whichever route it
tried first (``GET`` of ``/api/jobs/{jobId}``, not its ``PATCH`` and
``DELETE``). Where a concrete path and a template both match a URL, the
concrete one is the resource, as OpenAPI matches them (``/api/jobs/retry`` is
not job "retry"): ``shadow_guard`` answers 405 for the template's methods there,
which the router would otherwise hand to the template's routes (a guard is one
route more in front of the others: one more path match per routed request, two
guards in this app). The rest runs only on a 405, and on a body the JSON intake
refuses (core/http/json_intake.py: is its method one a route takes?)."""

from __future__ import annotations

import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from fastapi import FastAPI, Request
from fastapi.routing import iter_route_contexts
from starlette.exceptions import HTTPException
from starlette.routing import BaseRoute, Route, compile_path
from starlette.types import Scope

_PARAM = re.compile(r"{[^}]+}")


@dataclass(frozen=True, slots=True)
class Resource:
    template: str
    pattern: re.Pattern[str]
    methods: frozenset[str]

    @property
    def concrete(self) -> bool:
        return _PARAM.search(self.template) is None

    def allow(self) -> str:
        return ", ".join(sorted(self.methods))


def specificity(template: str) -> tuple[int, ...]:
    """Sort key: at the first segment where two templates differ in kind, the
    concrete segment comes first (OpenAPI: concrete paths before templated ones)."""
    return tuple(1 if _PARAM.search(s) else 0 for s in template.split("/"))


def resources(routes: Iterable[BaseRoute]) -> list[Resource]:
    """Every path template of the app with the union of its routes' methods,
    the most specific first."""
    methods: dict[str, set[str]] = {}
    for ctx in iter_route_contexts(list(routes)):
        route_methods = getattr(ctx.original_route, "methods", None)
        if getattr(ctx.original_route, "endpoint", None) is _not_allowed:
            continue  # a guard's methods are the ones the resource lacks
        if ctx.path is not None and route_methods:
            methods.setdefault(ctx.path, set()).update(route_methods)
    found = [Resource(path, compile_path(path)[0], frozenset(m)) for path, m in methods.items()]
    return sorted(found, key=lambda r: specificity(r.template))


def resource_at(found: Sequence[Resource], path: str) -> Resource | None:
    return next((r for r in found if r.pattern.match(path)), None)


def _resource(app: FastAPI, path: str) -> Resource | None:
    """The resource at ``path``; the app's resources are found once."""
    found: list[Resource] | None = getattr(app.state, "http_resources", None)
    if found is None:
        found = app.state.http_resources = resources(app.router.routes)
    return resource_at(found, path)


def allow_of(request: Request) -> str | None:
    """The ``Allow`` of a 405 for this request's path (every method of its
    resource), or None when no route's path matches it."""
    resource = _resource(request.app, request.url.path)
    return None if resource is None else resource.allow()


def routed(scope: Scope) -> bool:
    """Whether a route takes this request's method at its path: else the router
    answers it (404 or 405) whatever its body."""
    resource = _resource(scope["app"], scope["path"])
    return resource is not None and scope["method"] in resource.methods


async def _not_allowed(_: Request) -> None:
    raise HTTPException(status_code=405)


def shadow_guard(app: FastAPI) -> None:
    """Put, in front of every route, a 405 route for each concrete path that a
    template also matches, for the template's methods the concrete path does not
    have (``PATCH /api/jobs/retry``: 405, not ``PATCH /api/jobs/{jobId}`` with
    jobId "retry"). Call once every router is included."""
    found = resources(app.router.routes)
    guards: list[BaseRoute] = []
    for resource in found:
        if not resource.concrete:
            continue
        shadowing = {
            m
            for other in found
            if not other.concrete and other.pattern.match(resource.template)
            for m in other.methods
        }
        extra = shadowing - resource.methods
        if extra:
            guard = Route(
                resource.template, _not_allowed, methods=sorted(extra), include_in_schema=False
            )
            guards.append(guard)
    app.router.routes[:0] = guards
