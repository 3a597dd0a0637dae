"""/readyz counts Kafka when it is configured."""

from __future__ import annotations

import httpx

from reservo.app import create_app
from reservo.bootstrap import build
from reservo.settings import Settings
from tests.e2e.procs import free_port


async def _readyz(settings: Settings) -> httpx.Response:
    container = build(settings)
    try:
        app = create_app(container, owns_container=False)
        async with httpx.AsyncClient(
            transport=httpx.ASGITransport(app=app), base_url="http://reservo.test"
        ) as client:
            return await client.get("/readyz")
    finally:
        await container.close()


async def test_readyz_reports_kafka(base_settings: Settings, kafka_bootstrap: str) -> None:
    up = await _readyz(base_settings.model_copy(update={"kafka_bootstrap": kafka_bootstrap}))
    assert up.status_code == 200
    assert up.json()["checks"] == {"postgres": True, "redis": True, "kafka": True}

    nowhere = f"127.0.0.1:{free_port()}"
    down = await _readyz(base_settings.model_copy(update={"kafka_bootstrap": nowhere}))
    assert down.status_code == 503
    assert down.json()["checks"]["kafka"] is False
