"""Request count and latency per method, route template and status, for every
route (a concern of the request pipeline, core/http/pipeline.py)."""

from __future__ import annotations

import time
from typing import Any

from starlette.types import ASGIApp, Message, Receive, Scope, Send

from reservo.core.kernel import metrics, tracing


class RequestMetrics:
    """Request count and latency per method, route template and status. The
    labelled children are looked up once each: ``labels()`` validates and locks
    on every call. Same label sets as ``labels()`` would create.

    Each latency observation carries the request's trace id as its exemplar
    (OpenMetrics): the slow request a bucket counted is one click from its
    trace, and from its log lines (the trace id is on every one). Not under
    several processes: prometheus-client keeps no exemplars there."""

    def __init__(self) -> None:
        self._latency: dict[tuple[str, str], Any] = {}
        self._count: dict[tuple[str, str, int], Any] = {}

    def observe(self, method: str, route: str, status: int, seconds: float) -> None:
        latency = self._latency.get((method, route))
        if latency is None:
            latency = self._latency[method, route] = metrics.HTTP_LATENCY.labels(method, route)
        ctx = None if metrics.MULTIPROCESS else tracing.current()
        if ctx is None:
            latency.observe(seconds)
        else:
            latency.observe(seconds, {"trace_id": ctx.trace_id})
        count = self._count.get((method, route, status))
        if count is None:
            count = self._count[method, route, status] = metrics.HTTP_REQUESTS.labels(
                method, route, str(status)
            )
        count.inc()


# One per process.
REQUEST_METRICS = RequestMetrics()


class ObserveRequests:
    """Request count and latency per route template, as a plain ASGI middleware:
    ``@app.middleware("http")`` (BaseHTTPMiddleware) costs an anyio task group and
    memory streams per request, a large share of a cheap request's CPU."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        started = time.perf_counter()
        status = 500  # what the outer error middleware answers if the app raises

        async def observe_status(message: Message) -> None:
            nonlocal status
            if message["type"] == "http.response.start":
                status = message["status"]
            await send(message)

        try:
            await self.app(scope, receive, observe_status)
        finally:
            # The router writes the route it matched into the scope. Matching the
            # routes here instead missed every route of an included router.
            route = getattr(scope.get("route"), "path", None) or "unmatched"
            REQUEST_METRICS.observe(scope["method"], route, status, time.perf_counter() - started)
