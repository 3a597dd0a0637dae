"""The FastAPI application, built from a Container by the composition root."""

from __future__ import annotations

import asyncio
import contextlib
import gc
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from functools import partial

from fastapi import FastAPI
from fastapi.responses import JSONResponse, Response
from starlette.types import Receive, Scope, Send

from reservo import __version__
from reservo.bootstrap import Container
from reservo.core import metrics
from reservo.core.auth import TokenVerifier
from reservo.core.contract import asyncapi_text
from reservo.core.http import install_body_limit, install_error_handlers, install_metrics
from reservo.core.lean import LeanLayer


class ReservoAPI(FastAPI):
    """FastAPI with the lean path (core/lean.py) in front of its middleware stack."""

    lean: LeanLayer | None = None

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if self.lean is not None:
            await self.lean(scope, receive, send)
        else:
            await super().__call__(scope, receive, send)


def create_app(container: Container, *, owns_container: bool = True) -> FastAPI:
    @asynccontextmanager
    async def lifespan(_: FastAPI) -> AsyncIterator[None]:
        # Start anyway when PostgreSQL is away: requests answer 503 until it is back.
        with contextlib.suppress(Exception):
            await container.db.connect()
        stop = asyncio.Event()
        companions = [asyncio.ensure_future(run(stop)) for run in container.companions()]
        yield
        stop.set()
        await asyncio.gather(*companions, return_exceptions=True)
        if owns_container:
            await container.close()

    app = ReservoAPI(
        title="reservo",
        version=__version__,
        lifespan=lifespan,
        description="Never double-book, never double-spend, never lose an event.",
        # reservo exports Prometheus metrics (core/metrics.py) and configures no
        # OpenTelemetry; with FastAPI's native hooks on, every request looked the
        # global tracer, meter and logger providers up only to find them unset.
        telemetry={"tracing": False, "metrics": False, "logs": False},
    )
    metrics.BUILD_INFO.labels(__version__).set(1)
    app.state.container = container
    app.state.clock = container.clock
    app.state.jwt_secret = container.settings.jwt_secret
    app.state.tokens = TokenVerifier(
        container.settings.jwt_secret, container.settings.token_cache_size
    )
    app.state.idempotency = container.idempotency
    for module in container.modules:  # what each module's routes read
        for name, value in module.state.items():
            setattr(app.state, name, value)
    install_error_handlers(app)
    # Added before the metrics middleware so it runs inside it: 413s are counted.
    install_body_limit(app, container.settings.max_body_bytes)
    install_metrics(app)
    for module in container.modules:
        for router in module.routers:
            app.include_router(router)
    lean = [route for module in container.modules for route in module.lean]
    if lean and container.settings.lean_paths:
        # In front of the whole stack; it counts its answers in the same metrics.
        app.lean = LeanLayer(
            partial(FastAPI.__call__, app), lean, app, container.settings.max_body_bytes
        )

    @app.get("/healthz", tags=["operations"])
    async def healthz() -> dict[str, str]:
        return {"status": "ok", "version": __version__}

    @app.get("/readyz", tags=["operations"])
    async def readyz() -> JSONResponse:
        checks = await container.ready()
        ok = all(checks.values())
        body: dict[str, object] = {"ready": ok, "checks": checks}
        if checks["postgres"]:
            with contextlib.suppress(Exception):  # detail only: never fails readiness
                body["backlog"] = await container.backlog()
        if container.db.replicas is not None:  # detail only: reads fall back to the primary
            body["replicas"] = container.db.replicas.status()
        return JSONResponse(body, status_code=200 if ok else 503)

    # The event contract (AsyncAPI 3), made from what the modules declare.
    events_doc = asyncapi_text(container.events, __version__)

    @app.get("/asyncapi.json", tags=["operations"], include_in_schema=False)
    async def asyncapi_document() -> Response:
        return Response(events_doc, media_type="application/json")

    @app.get("/metrics", tags=["operations"], response_class=Response)
    async def metrics_endpoint() -> Response:
        body, content_type = metrics.render()
        return Response(body, media_type=content_type)

    return app


def from_environment() -> FastAPI:
    """uvicorn factory for `reservo api`: each API process builds its own graph."""
    from reservo.bootstrap import build
    from reservo.core.logging import configure
    from reservo.settings import Settings

    settings = Settings()
    configure(settings.log_level, settings.log_json)
    app = create_app(build(settings))
    # What the process built so far (modules, the app, its OpenAPI models) lives
    # as long as the process: moved out of the collector's reach, so that a full
    # collection during a storm walks only what was made since instead of
    # stalling every request in flight for the whole heap.
    gc.collect()
    gc.freeze()
    return app
