"""The request pipeline: every request, to any route, hot or not, passes the
same concerns in the same order, put together here and nowhere else:

    repeated Idempotency-Keys joined  (core/http/idempotency.py)
    trace, request id, access log,    (core/kernel/tracing.py,
      request metrics                  core/http/request_metrics.py: one
                                       status and one timing for the three)
    request deadline                  (core/http/deadline.py)
    body limit                        (core/http/body_limit.py)
    JSON intake                       (core/http/json_intake.py)
    the routes                        (core/http/hotroute.py's HotRouter: a hot
                                       route's compiled app, else FastAPI's app:
                                       its error handlers and its router)

Who calls (auth) and idempotent creation are per route: each route declares
them (core/http/callers.py, core/http/idempotent.py), and a hot route's
compiled app runs the same declarations. A new concern of every request goes in
``build`` below, in its place in that order; the app refuses
``add_middleware`` (it would wrap only the routes FastAPI's router
serves, not the hot ones)."""

from __future__ import annotations

from collections.abc import Sequence

from fastapi import FastAPI
from starlette.types import ASGIApp, Receive, Scope, Send

from reservo.core.http.body_limit import LimitRequestBody
from reservo.core.http.deadline import Deadlines
from reservo.core.http.hotroute import HotRoute, HotRouter
from reservo.core.http.idempotency import combine_repeated_keys
from reservo.core.http.json_intake import StrictJson
from reservo.core.http.request_metrics import REQUEST_METRICS
from reservo.core.kernel.access_log import AccessLog
from reservo.core.kernel.tracing import TracedRequests


def build(
    app: FastAPI,
    hot: Sequence[HotRoute],
    *,
    max_body_bytes: int,
    deadlines: Deadlines | None,
    access_log: AccessLog | None,
) -> ASGIApp:
    """The pipeline in front of ``app`` (FastAPI's own entry: lifespan, and the
    routes that are not ``hot``). Read from the bottom up: the last line is the
    outermost concern."""
    served: ASGIApp = HotRouter(FastAPI.__call__.__get__(app), hot, app)
    served = StrictJson(served)
    # Inside the metrics: a 413 is counted.
    served = LimitRequestBody(served, max_bytes=max_body_bytes)
    if deadlines is not None:
        served = _WithinDeadline(served, deadlines)
    # The deadline's own 503 passes through it too, counted and logged as sent.
    served = TracedRequests(served, access_log, REQUEST_METRICS)
    return _Entry(served, app)


class _WithinDeadline:
    """RESERVO_HTTP_REQUEST_DEADLINE_S on every HTTP request."""

    __slots__ = ("app", "deadlines")

    def __init__(self, app: ASGIApp, deadlines: Deadlines) -> None:
        self.app, self.deadlines = app, deadlines

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http":
            await self.deadlines.run(self.app, scope, receive, send)
        else:
            await self.app(scope, receive, send)


class _Entry:
    """The scope's ``app`` written first (as Starlette does: the concerns read
    the app's routes and state), and repeated Idempotency-Key lines joined into
    one before any route reads the header (``combine_repeated_keys``)."""

    __slots__ = ("app", "fastapi_app")

    def __init__(self, app: ASGIApp, fastapi_app: FastAPI) -> None:
        self.app, self.fastapi_app = app, fastapi_app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        scope["app"] = self.fastapi_app
        if scope["type"] == "http":
            combine_repeated_keys(scope)
        await self.app(scope, receive, send)
