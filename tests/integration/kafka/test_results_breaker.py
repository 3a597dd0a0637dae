"""The result webhook's circuit breaker against a real broker that goes away:
a Tansu broker of this test's own (tests/integration/kafka/conftest.py starts
the shared one), which the webhook's producer has talked to, is stopped. The
first result waits out the retry budget and opens the breaker; from then on a
result is stored in webhook_events_fallback at once (202 in well under 100 ms,
nothing sent to Kafka). Once the broker is back, the resender publishes the
stored results and the settlement consumer settles their matches."""

from __future__ import annotations

import asyncio
import statistics
import time
import uuid
from collections.abc import AsyncIterator
from datetime import timedelta
from pathlib import Path
from typing import Any

import httpx
import pytest
from prometheus_client import REGISTRY

from reservo.app import create_app
from reservo.betting.setup import Betting
from reservo.bootstrap import Container, build, run_workers
from reservo.core.aio.breaker import State
from reservo.core.embedded import EmbeddedKafka
from reservo.core.kernel.clock import OffsetClock
from reservo.settings import Settings
from tests.helpers.betting import kick_off, make_match, post_result, result_body
from tests.helpers.waiting import wait_until

TIMEOUT_S, ATTEMPTS, BACKOFF_S = 0.5, 3, 0.2
# The least a result waits before the fallback while the breaker is closed: the
# backoffs between its attempts (each attempt's own failure may be instant).
RETRY_BUDGET_S = BACKOFF_S * (1 + 2)
OPEN_RESULTS = 6


@pytest.fixture
def broker(tmp_path: Path) -> AsyncIterator[EmbeddedKafka]:
    kafka = EmbeddedKafka(tmp_path)
    kafka.start()
    yield kafka
    kafka.stop()


@pytest.fixture
async def app(
    base_settings: Settings, broker: EmbeddedKafka, kafka_database_url: str
) -> AsyncIterator[tuple[Container, httpx.AsyncClient]]:
    settings = base_settings.with_(
        database_url=kafka_database_url,
        kafka_bootstrap=broker.bootstrap,
        kafka_idempotence=False,
        kafka_group_prefix=f"breaker-{uuid.uuid4().hex[:6]}",
        betting_publish_timeout_s=TIMEOUT_S,
        betting_publish_attempts=ATTEMPTS,
        betting_publish_backoff_s=BACKOFF_S,
        betting_breaker_failures=ATTEMPTS,
        betting_breaker_reset_s=600,  # stays open for the whole outage here
    )
    c = build(settings, OffsetClock())
    transport = httpx.ASGITransport(app=create_app(c, owns_container=False))
    async with httpx.AsyncClient(transport=transport, base_url="http://reservo.test") as client:
        yield c, client
    await c.close()


async def _timed(client: httpx.AsyncClient, c: Container, match: dict[str, Any]) -> float:
    body = result_body(match["externalId"], 2, 1, event=f"prov-{uuid.uuid4()}")
    t0 = time.perf_counter()
    r = await post_result(client, body, c.clock)
    took = time.perf_counter() - t0
    assert r.status_code == 202, r.text
    return took


def _refused_by_the_breaker() -> float:
    return (
        REGISTRY.get_sample_value("reservo_breaker_rejected_total", {"breaker": "results_kafka"})
        or 0.0
    )


async def _where(c: Container, match: dict[str, Any]) -> list[str]:
    async with c.db.connection() as conn:
        rows = await conn.fetch(
            "SELECT status FROM webhook_events_fallback WHERE payload->>'matchExternalId' = $1",
            match["externalId"],
        )
    return [r["status"] for r in rows]


async def test_with_kafka_down_an_open_breaker_stores_results_at_once_then_they_settle(
    app: tuple[Container, httpx.AsyncClient], broker: EmbeddedKafka
) -> None:
    c, client = app
    breaker = c.module(Betting).results.breaker
    matches = [await make_match(client, timedelta(minutes=1)) for _ in range(2 + OPEN_RESULTS)]
    kick_off(c.clock, *matches)
    up, first, opened = matches[0], matches[1], matches[2:]

    # Kafka up: the producer connects and Kafka holds the result.
    await _timed(client, c, up)
    assert await _where(c, up) == []

    bootstrap = broker.bootstrap
    broker.stop()
    # The first result after the outage waits out the retry budget, then is
    # stored; its failed attempts open the breaker.
    took_first = await _timed(client, c, first)
    assert took_first >= RETRY_BUDGET_S, took_first
    assert await _where(c, first) == ["PENDING"]
    # Open: each result goes to the fallback table without trying Kafka.
    refused = _refused_by_the_breaker()
    took = [await _timed(client, c, m) for m in opened]
    assert statistics.median(took) < 0.1, took
    assert _refused_by_the_breaker() - refused == OPEN_RESULTS, "a result tried Kafka"
    for m in opened:
        assert await _where(c, m) == ["PENDING"]
    assert breaker.state is State.OPEN

    # Kafka back (same address; this broker keeps records in memory, so the
    # result Kafka held before the outage is gone with it): the resender
    # publishes what the table holds and the consumer settles those matches.
    broker.start()
    assert broker.bootstrap == bootstrap
    stop = asyncio.Event()
    workers = asyncio.create_task(run_workers(c, ["betting.settlement"], stop))
    resender = c.module(Betting).resender
    held = [first, *opened]

    async def resent() -> bool:
        await resender.run_once()
        c.clock.advance(timedelta(seconds=61))  # past any resend backoff (capped at 60 s)
        return [await _where(c, m) for m in held] == [["RESENT"]] * len(held)

    async def settled() -> bool:
        async with c.db.connection() as conn:
            done = await conn.fetchval(
                "SELECT count(*) FROM betting_match WHERE id = ANY($1::bigint[])"
                " AND settlement_status = 'SETTLED'",
                [m["id"] for m in held],
            )
        return int(done) == len(held)

    try:
        await wait_until(resent, 60, "the fallback rows to be resent through Kafka")
        await wait_until(settled, 60, "every match to be settled from Kafka")
    finally:
        stop.set()
        await asyncio.wait_for(workers, 30)
