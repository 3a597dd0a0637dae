"""Liveness and readiness as an orchestrator reads them (core/http/health.py).

/healthz never looks at a dependency. /readyz fails only on what serving needs
(PostgreSQL); Redis down reads ``degraded`` in its body and in
``reservo_dependency_up`` while it stays 200 (Redis is a fail-open filter). Both
answer HEAD. Kafka's check: tests/integration/kafka/test_kafka_readiness.py."""

from __future__ import annotations

import socket
from collections.abc import AsyncIterator

import httpx
import pytest

from reservo.app import create_app
from reservo.bootstrap import Container, build
from reservo.core.kernel.clock import OffsetClock
from reservo.settings import Settings
from tests.helpers.appointments import make_slots


def _nowhere() -> str:
    """host:port where nothing listens (connections are refused at once)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return f"127.0.0.1:{s.getsockname()[1]}"


async def _client_of(container: Container) -> AsyncIterator[httpx.AsyncClient]:
    transport = httpx.ASGITransport(app=create_app(container, owns_container=False))
    async with httpx.AsyncClient(transport=transport, base_url="http://reservo.test") as c:
        yield c
    await container.close()


@pytest.fixture
async def without_redis(
    base_settings: Settings, clock: OffsetClock
) -> AsyncIterator[httpx.AsyncClient]:
    settings = base_settings.with_(redis_url=f"redis://{_nowhere()}/0")
    async for c in _client_of(build(settings, clock)):
        yield c


@pytest.fixture
async def without_postgres(
    base_settings: Settings, clock: OffsetClock
) -> AsyncIterator[httpx.AsyncClient]:
    settings = base_settings.with_(database_url=f"postgresql://postgres@{_nowhere()}/postgres")
    async for c in _client_of(build(settings, clock)):
        yield c


def _gauge(metrics_text: str, dependency: str) -> float:
    prefix = f'reservo_dependency_up{{dependency="{dependency}"}} '
    (line,) = [ln for ln in metrics_text.splitlines() if ln.startswith(prefix)]
    return float(line.removeprefix(prefix))


async def test_head_answers_on_both_probes(client: httpx.AsyncClient) -> None:
    for path in ("/healthz", "/readyz"):
        r = await client.head(path)
        assert r.status_code == 200, (path, r.status_code)
        assert r.content == b""
    get = await client.get("/readyz")
    assert get.status_code == 200, get.text
    assert get.json()["status"] == "ok"
    assert get.json()["checks"] == {"postgres": "up", "redis": "up"}


async def test_redis_down_is_degraded_not_unready(without_redis: httpx.AsyncClient) -> None:
    client = without_redis
    # Every request is still served (Redis is a filter and a cache) ...
    _, slots = await make_slots(client)
    assert slots
    # ... so readiness stays 200 and says what is missing.
    ready = await client.get("/readyz")
    assert ready.status_code == 200, ready.text
    body = ready.json()
    assert body["ready"] is True and body["status"] == "degraded"
    assert body["checks"] == {"postgres": "up", "redis": "degraded"}
    assert "backlog" in body
    assert (await client.head("/readyz")).status_code == 200
    metrics = (await client.get("/metrics")).text
    assert _gauge(metrics, "redis") == 0 and _gauge(metrics, "postgres") == 1
    assert (await client.get("/healthz")).status_code == 200


async def test_postgres_down_is_unready_and_liveness_holds(
    without_postgres: httpx.AsyncClient,
) -> None:
    client = without_postgres
    ready = await client.get("/readyz")
    assert ready.status_code == 503, ready.text
    body = ready.json()
    assert body["ready"] is False and body["status"] == "unavailable"
    assert body["checks"] == {"postgres": "down", "redis": "up"}
    assert (await client.head("/readyz")).status_code == 503
    assert _gauge((await client.get("/metrics")).text, "postgres") == 0
    # Liveness never depends on a dependency: restarting would not bring it back.
    for path in ("/healthz", "/livez"):
        live = await client.get(path)
        assert live.status_code == 200 and live.json()["status"] == "ok"
        assert (await client.head(path)).status_code == 200
