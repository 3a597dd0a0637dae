"""Every problem the API answers is one its OpenAPI document lists for that
operation: the `client` fixture (tests/conftest.py) checks each response with
``ProblemAudit``, so every test that meets a refusal also checks that the
document declares it (status and code), and a code raised on a route that does
not declare it fails the test that met it."""

from __future__ import annotations

import re
from typing import Any

import httpx
from fastapi import FastAPI
from fastapi.routing import APIRoute, iter_route_contexts

from reservo.core.http.methods import specificity

PROBLEM_JSON = "application/problem+json"


def declared(op: dict[str, Any], status: int) -> set[str]:
    """The codes ``op`` documents for ``status`` (its examples, one per code)."""
    response = op.get("responses", {}).get(str(status), {})
    return set(response.get("content", {}).get(PROBLEM_JSON, {}).get("examples", {}))


class ProblemAudit:
    def __init__(self, app: FastAPI) -> None:
        self.app = app
        self.routes: list[tuple[re.Pattern[str], frozenset[str], str]] = []
        for ctx in iter_route_contexts(list(app.routes)):
            if isinstance(ctx.original_route, APIRoute) and ctx.include_in_schema:
                template = str(ctx.path_format)
                pattern = re.compile("^" + re.sub(r"\{[^}]+\}", "[^/]+", template) + "$")
                self.routes.append((pattern, frozenset(ctx.methods or ()), template))
        # A concrete path before a template that matches it too (core/http/methods.py).
        self.routes.sort(key=lambda r: specificity(r[2]))
        self.seen: set[tuple[str, str, int, str]] = set()

    def operation(self, method: str, path: str) -> tuple[str, dict[str, Any]] | None:
        """The operation of the path's resource (its most specific template)."""
        resource = next((t for p, _, t in self.routes if p.match(path)), None)
        for _, methods, template in self.routes:
            if template == resource and method in methods:
                return template, self.app.openapi()["paths"][template][method.lower()]
        return None

    async def __call__(self, response: httpx.Response) -> None:
        if response.status_code < 400:
            return
        if not response.headers.get("content-type", "").startswith(PROBLEM_JSON):
            return
        found = self.operation(response.request.method, response.request.url.path)
        if found is None:  # no such route: the router's own 404/405
            return
        template, op = found
        await response.aread()
        code = response.json().get("code")
        self.seen.add((response.request.method, template, response.status_code, code))
        assert code in declared(op, response.status_code), (
            f"{response.request.method} {template} answered {response.status_code} "
            f"{code!r}, which its OpenAPI operation {op['operationId']} does not list: add it "
            f"to the route's raises(...) (core/http/openapi.py)"
        )
