"""Betting over a real Kafka-protocol broker: the webhook publishes the result to
``betting.match.result-reported.v1``, the ``betting.settlement`` consumer group settles it, payouts
travel through Kafka to the wallet. The same providerEventId also arriving
through the fallback table settles once."""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import AsyncIterator
from datetime import UTC, datetime, timedelta
from decimal import Decimal
from typing import Any

import httpx
import orjson
import pytest

from reservo.app import create_app
from reservo.betting.domain import Leg
from reservo.betting.events import RESULT_TOPIC, result_event_id
from reservo.betting.setup import Betting
from reservo.bootstrap import Container, build, run_workers
from reservo.core.kernel.clock import OffsetClock
from reservo.settings import Settings
from tests.helpers.auth import ADMIN
from tests.helpers.betting import (
    ODDS,
    kick_off,
    make_account,
    make_match,
    post_result,
    result_body,
)
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


async def test_results_through_kafka_are_kept_for_their_match_or_parked_never_dropped(
    kafka_container: Container,
) -> None:
    """The three drops of the results consumer, over Kafka: a result before its
    match is kept and applied when the match is created; the same event sent
    again changes nothing; a conflicting result for the settled match is parked
    as one dead letter (the consumer parks it in its own transaction, so the
    Kafka runner does not park it again), which a replay refuses."""
    c = kafka_container
    app = create_app(c, owns_container=False)
    stop = asyncio.Event()
    workers = asyncio.create_task(run_workers(c, ["relay", "betting.settlement"], stop))

    async def outcome(event: str) -> str | None:
        async with c.db.connection() as conn:
            got = await conn.fetchval(
                "SELECT outcome FROM betting_result_inbox WHERE provider_event_id = $1", event
            )
        return None if got is None else str(got)

    async def letters(event: str) -> list[dict[str, Any]]:
        r = await client.get(
            "/api/ops/dead-letters", params={"consumer": "betting.settlement"}, headers=ADMIN
        )
        assert r.status_code == 200, r.text
        return [d for d in r.json()["items"] if d["eventId"] == str(result_event_id(event))]

    try:
        async with httpx.AsyncClient(
            transport=httpx.ASGITransport(app=app), base_url="http://reservo.test"
        ) as client:
            external_id = f"before-{uuid.uuid4()}"
            event = f"prov-{uuid.uuid4()}"
            body = result_body(external_id, 2, 0, event=event)
            assert (await post_result(client, body)).status_code == 202

            async def kept() -> bool:
                return await outcome(event) == "AWAITING_MATCH"

            await wait_until(kept, 60, "the result to be kept for its match")
            async with c.db.connection() as conn:
                # Kafka acknowledged it: the fallback table never held it.
                assert not await conn.fetchval(
                    "SELECT count(*) FROM webhook_events_fallback WHERE provider_event_id = $1",
                    event,
                )
            created = await client.post(
                "/api/matches",
                json={
                    "externalId": external_id,
                    "home": "Ajax",
                    "away": "PSV",
                    "startsAt": (datetime.now(UTC) - timedelta(hours=2)).isoformat(),
                    "odds": ODDS,
                },
                headers=ADMIN,
            )
            assert created.status_code == 201, created.text
            assert created.json()["result"]["providerEventId"] == event
            assert created.json()["settlement"]["status"] == "SETTLED"
            assert await outcome(event) == "APPLIED"

            # The same event again, then a conflicting one.
            assert (await post_result(client, body)).status_code == 202
            conflicting = f"prov-{uuid.uuid4()}"
            assert (
                await post_result(client, result_body(external_id, 0, 1, event=conflicting))
            ).status_code == 202

            async def parked() -> bool:
                return await outcome(conflicting) == "PARKED"

            await wait_until(parked, 60, "the conflicting result to be parked")
            await asyncio.sleep(1.0)  # let any second parking land before counting
            (letter,) = await letters(conflicting)
            assert letter["topic"] == RESULT_TOPIC and letter["replayedAt"] is None
            assert await letters(event) == []
            r = await client.post(f"/api/ops/dead-letters/{letter['id']}/replay", headers=ADMIN)
            assert (r.status_code, r.json()["code"]) == (409, "not_replayable"), r.text
            async with c.db.connection() as conn:
                row = await conn.fetchrow(
                    "SELECT result_event_id, home_score, away_score, settlement_status"
                    " FROM betting_match WHERE external_id = $1",
                    external_id,
                )
            assert tuple(row) == (event, 2, 0, "SETTLED")
            assert await outcome(event) == "APPLIED"
    finally:
        stop.set()
        await asyncio.wait_for(workers, 30)
