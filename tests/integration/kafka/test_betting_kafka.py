"""Betting over a real Kafka-protocol broker: the webhook publishes the result to
``betting.match.result-reported.v1``, the ``betting.settlement`` consumer group settles it, payouts
travel through Kafka to the wallet. The same providerEventId also arriving
through the fallback table settles once."""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import AsyncIterator
from decimal import Decimal

import httpx
import orjson
import pytest

from reservo.app import create_app
from reservo.betting.domain import Leg
from reservo.betting.setup import Betting
from reservo.bootstrap import Container, build, run_workers
from reservo.core.kernel.clock import OffsetClock
from reservo.settings import Settings
from tests.helpers.betting import kick_off, make_account, make_match, post_result, result_body
from tests.helpers.waiting import wait_until


@pytest.fixture
async def kafka_container(
    base_settings: Settings, kafka_bootstrap: str, kafka_database_url: str
) -> AsyncIterator[Container]:
    settings = base_settings.with_(
        database_url=kafka_database_url,
        kafka_bootstrap=kafka_bootstrap,
        kafka_idempotence=False,
        kafka_group_prefix=f"bet-{uuid.uuid4().hex[:6]}",
        kafka_relay_batch_size=200,
    )
    c = build(settings, OffsetClock())
    yield c
    await c.close()


async def test_result_through_kafka_and_fallback_settles_once(
    kafka_container: Container,
) -> None:
    c = kafka_container
    app = create_app(c, owns_container=False)
    stop = asyncio.Event()
    workers = asyncio.create_task(
        run_workers(c, ["relay", "betting.settlement", "wallet.payouts"], stop)
    )
    try:
        async with httpx.AsyncClient(
            transport=httpx.ASGITransport(app=app), base_url="http://reservo.test"
        ) as client:
            match = await make_match(client)
            account, _ = await make_account(client, 1_000)
            bet = await c.module(Betting).service.place_bet(
                account, 200, [Leg(match["id"], "TOTALS_2_5", "OVER", Decimal("1.95"))]
            )
            event = f"prov-{uuid.uuid4()}"
            body = result_body(match["externalId"], 3, 2, event=event)
            kick_off(c.clock, match)
            r = await post_result(client, body, c.clock)
            assert r.status_code == 202, r.text
            async with c.db.connection() as conn:
                # Kafka acknowledged it: nothing went to the fallback table.
                assert not await conn.fetchval(
                    "SELECT count(*) FROM webhook_events_fallback WHERE provider_event_id = $1",
                    event,
                )
                # The same providerEventId also reaches the fallback path (e.g. a
                # webhook whose Kafka ack was lost): the resend worker republishes it.
                await conn.execute(
                    "INSERT INTO webhook_events_fallback"
                    " (id, provider_event_id, payload, created_at) VALUES ($1, $2, $3, now())",
                    uuid.uuid4(),
                    event,
                    orjson.loads(body),
                )
            await c.module(Betting).resender.run_once()

            async def paid() -> bool:
                async with c.db.connection() as conn:
                    got: int = await conn.fetchval(
                        "SELECT balance FROM wallet_account WHERE id = $1", account
                    )
                return got == 800 + 390

            await wait_until(paid, 60, "the payout to be credited through Kafka")
            await asyncio.sleep(1.0)  # let any duplicate delivery land before counting
            async with c.db.connection() as conn:
                row = await conn.fetchrow(
                    "SELECT settlement_status, settled_bets FROM betting_match WHERE id = $1",
                    match["id"],
                )
                assert (row["settlement_status"], row["settled_bets"]) == ("SETTLED", 1)
                assert (
                    await conn.fetchval(
                        "SELECT count(*) FROM wallet_transfer"
                        " WHERE kind = 'PAYOUT' AND reference = $1",
                        f"bet:{bet.id}",
                    )
                    == 1
                )
                assert (
                    await conn.fetchval(
                        "SELECT status FROM webhook_events_fallback WHERE provider_event_id = $1",
                        event,
                    )
                    == "RESENT"
                )
                assert (
                    await conn.fetchval("SELECT balance FROM wallet_account WHERE id = $1", account)
                    == 1_190
                )
    finally:
        stop.set()
        await asyncio.wait_for(workers, 30)
