"""/readyz and Kafka: the check proves the broker answers (a metadata request
within the timeout, not a TCP connect: a frozen broker's kernel still accepts);
Kafka away only degrades the service (the outbox keeps the events); a flood of
probes costs the broker one check per cache period."""

from __future__ import annotations

import asyncio
import os
import signal
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path

import httpx

from reservo.app import create_app
from reservo.bootstrap import build
from reservo.core.embedded import EmbeddedKafka
from reservo.settings import Settings
from tests.helpers.procs import free_port
from tests.helpers.proxy import TcpProxy


@asynccontextmanager
async def _client(settings: Settings) -> AsyncIterator[httpx.AsyncClient]:
    container = build(settings)
    try:
        app = create_app(container, owns_container=False)
        async with httpx.AsyncClient(
            transport=httpx.ASGITransport(app=app), base_url="http://reservo.test"
        ) as client:
            yield client
    finally:
        await container.close()


async def _readyz(settings: Settings) -> httpx.Response:
    async with _client(settings) as client:
        return await client.get("/readyz")


def _kafka_gauge(metrics_text: str) -> float:
    prefix = 'reservo_dependency_up{dependency="kafka"} '
    (line,) = [ln for ln in metrics_text.splitlines() if ln.startswith(prefix)]
    return float(line.removeprefix(prefix))


class CountingProxy(TcpProxy):
    """The broker behind a port that counts the connections made to it."""

    accepted = 0

    async def _serve(self, creader: asyncio.StreamReader, cwriter: asyncio.StreamWriter) -> None:
        self.accepted += 1
        await super()._serve(creader, cwriter)


async def test_readyz_reports_kafka(base_settings: Settings, kafka_bootstrap: str) -> None:
    up = await _readyz(base_settings.with_(kafka_bootstrap=kafka_bootstrap))
    assert up.status_code == 200
    assert up.json()["checks"] == {"postgres": "up", "redis": "up", "kafka": "up"}
    assert up.json()["status"] == "ok"

    nowhere = f"127.0.0.1:{free_port()}"
    down = await _readyz(base_settings.with_(kafka_bootstrap=nowhere))
    # Served all the same: events wait in the outbox until the broker is back.
    assert down.status_code == 200, down.text
    assert down.json()["checks"]["kafka"] == "degraded"
    assert down.json()["status"] == "degraded"


async def test_frozen_broker_reads_degraded_within_the_timeout(
    base_settings: Settings, tmp_path: Path
) -> None:
    timeout_s = 0.5
    broker = EmbeddedKafka(tmp_path)
    bootstrap = broker.start()
    settings = base_settings.with_(
        kafka_bootstrap=bootstrap, ready_timeout_s=timeout_s, ready_cache_s=0.0
    )
    server = broker._server()
    assert server is not None
    try:
        async with _client(settings) as client:
            assert (await client.get("/readyz")).json()["checks"]["kafka"] == "up"
            os.kill(server.pid, signal.SIGSTOP)  # it still accepts connections (the kernel)
            try:
                t0 = time.monotonic()
                frozen = await client.get("/readyz")
                took = time.monotonic() - t0
                assert frozen.status_code == 200, frozen.text
                assert frozen.json()["checks"]["kafka"] == "degraded"
                assert took < timeout_s + 1.0, took
                assert _kafka_gauge((await client.get("/metrics")).text) == 0
            finally:
                os.kill(server.pid, signal.SIGCONT)
            back = await client.get("/readyz")
            assert back.json()["checks"]["kafka"] == "up", back.text
            assert _kafka_gauge((await client.get("/metrics")).text) == 1
    finally:
        broker.stop()


async def test_a_probe_flood_checks_the_broker_once_per_period(
    base_settings: Settings, kafka_bootstrap: str
) -> None:
    host, _, port = kafka_bootstrap.rpartition(":")
    proxy = CountingProxy(free_port(), (host, int(port)))
    await proxy.start()
    settings = base_settings.with_(kafka_bootstrap=f"127.0.0.1:{proxy.port}", ready_cache_s=30.0)
    try:
        async with _client(settings) as client:
            flood = await asyncio.gather(*(client.get("/readyz") for _ in range(100)))
            assert {r.status_code for r in flood} == {200}
            assert {r.json()["checks"]["kafka"] for r in flood} == {"up"}
            assert proxy.accepted == 1  # one metadata request answered them all
    finally:
        await proxy.stop()
