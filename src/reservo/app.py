"""The FastAPI application, built from a Container by the composition root."""

from __future__ import annotations

import asyncio
import contextlib
import gc
import json
import os
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import structlog
from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, Response
from starlette.types import ASGIApp, Receive, Scope, Send

from reservo import __version__
from reservo.bootstrap import Container
from reservo.core.db.clock import DatabaseClock
from reservo.core.http import pipeline
from reservo.core.http.auth import TokenVerifier
from reservo.core.http.deadline import Deadlines
from reservo.core.http.graceful import STATE_KEY, Drain, draining
from reservo.core.http.hotroute import hot_routes
from reservo.core.http.jwks import Provider, ProviderConfig, provider_from
from reservo.core.http.methods import shadow_guard
from reservo.core.http.openapi import finish, install_pages
from reservo.core.http.problems import install_error_handlers
from reservo.core.kernel import metrics, tracing
from reservo.core.kernel.access_log import AccessLog
from reservo.core.kernel.contract import asyncapi_text
from reservo.settings import Settings

TITLE = "reservo"
# The document's description: what holds for every operation, before any lists its own.
DESCRIPTION = """Never double-book, never double-spend, never lose an event.

**Errors.** Every error answer is `application/problem+json` (the `Problem`
schema; `code` names it, `/problems/{code}` describes it). Each operation lists
the codes it answers with. These are answered before any operation runs, and
the connection is closed after each (a lingering close: a client still
sending its request reads the answer whole):

- 400 `bad_request`: not a valid HTTP/1.1 request (a control byte in a header
  name, `Content-Length` beside `Transfer-Encoding: chunked`, a negative
  `Content-Length`, ...); `detail` gives the parser's reason;
- 505 `http_version_not_supported`: a version other than HTTP/1.1 and HTTP/1.0;
- 408 `request_timeout`: headers or body too slow;
- 413 `payload_too_large`: a body past the size limit, declared or streamed;
- 431 `headers_too_large`: request line and headers past their limit.

A JSON body naming one key twice in one object, at any depth, is 422
`duplicate_key` and changes nothing; a request with more than one
`Idempotency-Key` header is 400 `idempotency_key_required`.

**Idempotency-Key.** A create that takes the header runs at most once per
caller, endpoint and key. A retry gets the first request's stored answer (a
201 replayed as 200 with the same body, a refusal as it was); another body
under the key is 422 `idempotency_key_reused`. A retry sent while the first
request still runs waits for it (up to the server's wait, 2 s unless its
operator changed it) and gets its answer; only past the wait is it 409
`request_in_progress`, with `Retry-After`."""
# Every tag an operation may carry, each with what a reader finds under it. An
# operation under a tag missing here fails the document's build (core/http/openapi.py).
TAGS = [
    {
        "name": "appointments",
        "description": "Doctors, their schedules and slots; appointments booked, "
        "paid, cancelled; calendar feeds.",
    },
    {
        "name": "rentals",
        "description": "Cars, bookings held, paid through the gateway, returned; "
        "the gateway's payment webhook.",
    },
    {
        "name": "wallet",
        "description": "Accounts, deposits, withdrawals, transfers and statements: "
        "a balance never goes below zero and never moves twice.",
    },
    {
        "name": "betting",
        "description": "Matches, their odds and results; bets placed and settled; "
        "the results provider's webhook.",
    },
    {
        "name": "jobs",
        "description": "Delayed and recurring jobs: scheduled, run at least once, "
        "cancelled, inspected.",
    },
    {
        "name": "webhooks",
        "description": "Outgoing webhooks (admin): endpoints, their signed deliveries, redelivery.",
    },
    {
        "name": "operations",
        "description": "What operators and orchestrators call: liveness, readiness, "
        "metrics, dead letters.",
    },
]
log = structlog.get_logger(__name__)


class ReservoAPI(FastAPI):
    """FastAPI behind the request pipeline (core/http/pipeline.py): every request,
    hot route or not, passes its concerns, then reaches its route."""

    pipeline: ASGIApp | None = None
    _finished: dict[str, Any] | None = None

    def openapi(self) -> dict[str, Any]:
        """FastAPI's document, finished once (core/http/openapi.py): security, problem
        responses per operation, required Idempotency-Keys. FastAPI makes a new
        one whenever routes were added since."""
        doc = super().openapi()
        if doc is not self._finished:
            self._finished = finish(doc, self.routes, "/api/")
        return doc

    def add_middleware(self, *_: Any, **__: Any) -> None:
        raise TypeError(
            "a middleware here would miss the hot routes: a concern of every request "
            "goes in the request pipeline (core/http/pipeline.py)"
        )

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if self.pipeline is not None:
            await self.pipeline(scope, receive, send)
        else:
            await super().__call__(scope, receive, send)


def create_app(container: Container, *, owns_container: bool = True) -> FastAPI:
    drain = Drain(container.settings.http_drain_s)

    @asynccontextmanager
    async def lifespan(_: FastAPI) -> AsyncIterator[dict[str, Drain]]:
        await _connect(container)
        container.stale.start()
        stop = asyncio.Event()
        companions = [asyncio.ensure_future(run(stop)) for run in container.companions()]
        if provider is not None:  # the key set, fetched now and kept fresh
            companions.append(asyncio.ensure_future(provider.keys.run(stop)))
        drain.install()
        # In the lifespan state: the server's connections read it (core/http/slow_clients.py).
        yield {STATE_KEY: drain}
        drain.uninstall()
        stop.set()
        await asyncio.gather(*companions, return_exceptions=True)
        if owns_container:
            await container.close()
            # The spans still buffered, before the process ends (a blocking flush).
            await asyncio.to_thread(tracing.shutdown)

    app = ReservoAPI(
        title=TITLE,
        # No trailing-slash redirects: Starlette builds their Location from the
        # request's Host header, which the caller chooses. A path is served as
        # written or answers 404.
        redirect_slashes=False,
        version=__version__,
        lifespan=lifespan,
        description=DESCRIPTION,
        openapi_tags=TAGS,
        # Relative: the paths are served wherever the service is deployed.
        servers=[{"url": "/", "description": "This service, where it is deployed"}],
        contact={"name": "reservo maintainers"},
        # reservo exports Prometheus metrics (core/kernel/metrics.py) and makes its own
        # spans (core/kernel/tracing.py: one per request, only when an exporter is
        # configured); with FastAPI's native hooks on, every request looked the
        # global tracer, meter and logger providers up, most often to find them unset.
        telemetry={"tracing": False, "metrics": False, "logs": False},
        # Served by install_pages from packaged assets, not FastAPI's CDN pages.
        docs_url=None,
        redoc_url=None,
    )
    metrics.BUILD_INFO.labels(__version__).set(1)
    provider = _install_state(app, container)
    install_error_handlers(app)
    for module in container.modules:
        for router in module.routers:
            app.include_router(router)
    install_pages(app, TITLE)
    app.pipeline = _pipeline(app, container)
    _install_operations(app, container)
    shadow_guard(app)  # once every route is there
    return app


def _pipeline(app: FastAPI, container: Container) -> ASGIApp:
    """The request pipeline in front of the app (core/http/pipeline.py), its hot
    routes compiled from their declarations."""
    settings = container.settings
    modules = container.modules
    hot = hot_routes(app, [endpoint for module in modules for endpoint in module.hot])
    access_log = None
    if settings.access_log:
        hot_paths = (h.route.path for h in hot)
        access_log = AccessLog(settings.access_log_sample, settings.access_log_slow_ms, hot_paths)
    unbounded = [path for module in modules for path in module.unbounded]
    return pipeline.build(
        app,
        # Without lean paths, the hot routes' compiled apps are reached through
        # FastAPI's router (the same apps, and the same concerns before them).
        hot if settings.lean_paths else (),
        max_body_bytes=settings.max_body_bytes,
        deadlines=Deadlines.of(settings.http_request_deadline_s, unbounded),
        access_log=access_log,
    )


async def _connect(container: Container) -> None:
    """The pool, and PostgreSQL's time before the first request (its companion
    keeps reading it; until one reading succeeds, the wall clock). Starts anyway
    when PostgreSQL is away: requests answer 503 until it is back."""
    with contextlib.suppress(Exception):
        await container.db.connect()
        if isinstance(container.clock, DatabaseClock):
            await container.clock.sync()


def _install_state(app: FastAPI, container: Container) -> Provider | None:
    """What the routes read from ``app.state``: the clock, the token verifier
    (and the identity provider it trusts, returned for the lifespan to keep its
    keys fresh), the idempotency store and what each module declares."""
    app.state.clock = container.clock
    app.state.jwt_secret = container.settings.jwt_secret
    provider = identity_provider(container.settings)
    app.state.tokens = TokenVerifier(
        container.settings.jwt_secret,
        container.settings.token_cache_size,
        container.settings.jwt_max_lifetime_s,
        provider,
        accept_hs256=container.settings.jwt_accept_hs256,
    )
    app.state.idempotency = container.idempotency
    for module in container.modules:  # what each module's routes read
        for name, value in module.state.items():
            setattr(app.state, name, value)
    return provider


def _install_operations(app: FastAPI, container: Container) -> None:
    """What operators and orchestrators call: liveness, readiness, the event
    contract and the metrics."""

    # HEAD too: some probes and uptime checkers send it. /livez is the name
    # Kubernetes' own components use for the same question.
    @app.get("/livez", tags=["operations"], operation_id="getLiveness")
    @app.head("/livez", tags=["operations"], operation_id="headLiveness")
    @app.get("/healthz", tags=["operations"], operation_id="getHealth")
    @app.head("/healthz", tags=["operations"], operation_id="headHealth")
    async def healthz() -> dict[str, str]:
        """Liveness: the process answers. It never looks at a dependency, so an
        outage never gets a healthy process restarted."""
        return {"status": "ok", "version": __version__}

    @app.get("/readyz", tags=["operations"], operation_id="getReadiness")
    @app.head("/readyz", tags=["operations"], operation_id="headReadiness")
    async def readyz(request: Request) -> JSONResponse:
        """Readiness: 503 while PostgreSQL does not answer or the process drains
        before stopping; Redis and Kafka down only make it ``degraded``."""
        if draining(request.scope.get("state", {})):
            body = {"ready": False, "status": "draining", "checks": {}}
            return JSONResponse(body, status_code=503)
        report = await container.ready()
        body = {"ready": report.ready, "status": report.status, "checks": report.checks}
        if report.checks["postgres"] == "up":
            with contextlib.suppress(Exception):  # detail only: never fails readiness
                body["backlog"] = await container.backlog()
        replicas = container.stale.status()
        if replicas is not None:  # detail only: reads fall back to the primary
            body["replicas"] = replicas
        return JSONResponse(body, status_code=200 if report.ready else 503)

    # The event contract (AsyncAPI 3), made from what the modules declare.
    events_doc = asyncapi_text(container.events, __version__)

    @app.get("/asyncapi.json", tags=["operations"], include_in_schema=False)
    async def asyncapi_document() -> Response:
        return Response(events_doc, media_type="application/json")

    @app.get(
        "/metrics",
        tags=["operations"],
        response_class=Response,
        operation_id="getMetrics",
        description=(
            "Prometheus metrics. `Accept: application/openmetrics-text` gets OpenMetrics 1.0 "
            "(request latency exemplars carry the trace id; ends with `# EOF`), anything "
            "else the Prometheus text format 0.0.4. HEAD answers the same headers."
        ),
    )
    async def metrics_endpoint(request: Request) -> Response:
        body, content_type = metrics.render(request.headers.get("accept"))
        return Response(body, media_type=content_type, headers={"Vary": "Accept"})

    # Scrapers and uptime checks probe with HEAD; its own route keeps the
    # OpenAPI document to one operation.
    app.add_api_route("/metrics", metrics_endpoint, methods=["HEAD"], include_in_schema=False)


def identity_provider(settings: Settings) -> Provider | None:
    """The identity provider whose tokens the API takes (RESERVO_JWT_JWKS_URL), if any."""
    if settings.jwt_jwks_url is None:
        return None
    if settings.jwt_issuer is None or settings.jwt_audience is None:
        # Allowed (some providers put no aud in access tokens), but then a token
        # the provider issued for any of its applications opens this API.
        log.warning(
            "jwt_provider_unpinned",
            warning="set RESERVO_JWT_ISSUER and RESERVO_JWT_AUDIENCE: without them any token "
            "of the provider's keys is taken, whichever application it was issued for",
        )
    audiences = (settings.jwt_audience or "").split(",")
    return provider_from(
        ProviderConfig(
            jwks_url=settings.jwt_jwks_url,
            issuer=settings.jwt_issuer,
            audiences=tuple(a.strip() for a in audiences if a.strip()),
            role_claim=settings.jwt_role_claim,
            sub_claim=settings.jwt_sub_claim,
            role_map=settings.jwt_role_map,
            refresh_s=settings.jwt_jwks_refresh_s,
            min_interval_s=settings.jwt_jwks_min_interval_s,
            timeout_s=settings.jwt_jwks_timeout_s,
        )
    )


def from_environment() -> FastAPI:
    """uvicorn factory for `reservo api`: each API process builds its own graph."""
    from reservo.bootstrap import build
    from reservo.core.kernel.logging import configure

    settings = Settings()
    configure(settings.log_level, settings.log_json)
    tracing.setup(os.environ, "reservo-api")
    app = create_app(build(settings))
    # What the process built so far (modules, the app, its OpenAPI models) lives
    # as long as the process: moved out of the collector's reach, so that a full
    # collection during a storm walks only what was made since instead of
    # stalling every request in flight for the whole heap.
    gc.collect()
    gc.freeze()
    return app


def openapi_document() -> dict[str, Any]:
    """The OpenAPI document GET /openapi.json serves, without a running service:
    the graph is built on placeholder settings (nothing connects) because the
    document depends on the code, not on the deployment."""
    from reservo.bootstrap import build
    from reservo.settings import Settings

    placeholder = "openapi-placeholder-secret-0123456789-"
    settings = Settings(
        database_url="postgresql://localhost/reservo",
        redis_url="redis://localhost:6379/0",
        jwt_secret=placeholder + "jwt",
        payments_webhook_secret=placeholder + "payments",
        results_webhook_secret=placeholder + "results",
    )
    return create_app(build(settings, announce=False)).openapi()


def openapi_text(doc: dict[str, Any]) -> str:
    """The checked-in form of the document (docs/openapi.json): stable, diffable."""
    return json.dumps(doc, indent=2, ensure_ascii=False) + "\n"
