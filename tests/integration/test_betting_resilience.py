"""Settlement under failure: Kafka down during the webhook, the settlement
worker killed mid-chunk, the same result through two paths."""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import AsyncIterator
from datetime import UTC, datetime, timedelta
from decimal import Decimal

import asyncpg
import httpx
import pytest

from reservo.app import create_app
from reservo.betting import events as betting_events
from reservo.betting.domain import Leg
from reservo.betting.settlement import Settlement
from reservo.betting.setup import Betting
from reservo.bootstrap import Container, build
from reservo.core.kernel.clock import OffsetClock
from reservo.core.messaging.transport.base import Event
from reservo.core_modules import Outbox
from reservo.settings import Settings
from reservo.wallet import PAYOUT_REQUESTED, Payout, payout_request
from reservo.wallet.setup import Wallet
from tests.helpers.betting import kick_off, make_account, make_match, post_result, result_body
from tests.helpers.waiting import drain


@pytest.fixture
async def kafka_down(base_settings: Settings, clock: OffsetClock) -> AsyncIterator[Container]:
    """A container whose Kafka is configured but unreachable (nothing listens on port 9)."""
    settings = base_settings.with_(
        kafka_bootstrap="127.0.0.1:9",
        betting_publish_timeout_s=0.5,
        betting_publish_attempts=2,
        betting_publish_backoff_s=0.01,
        betting_breaker_failures=2,
        kafka_request_timeout_ms=500,
    )
    c = build(settings, clock)
    yield c
    await c.close()


async def test_kafka_down_answers_202_from_the_fallback_then_resend_settles(
    client: httpx.AsyncClient,
    container: Container,
    kafka_down: Container,
    db: asyncpg.Connection,
) -> None:
    match = await make_match(client)
    account, _ = await make_account(client, 1_000)
    bet = await container.module(Betting).service.place_bet(
        account, 100, [Leg(match["id"], "1X2", "AWAY", Decimal("4.20"))]
    )
    app = create_app(kafka_down, owns_container=False)
    async with httpx.AsyncClient(
        transport=httpx.ASGITransport(app=app), base_url="http://reservo.test"
    ) as down:
        event = f"prov-{uuid.uuid4()}"
        kick_off(kafka_down.clock, match)
        r = await post_result(
            down, result_body(match["externalId"], 0, 3, event=event), kafka_down.clock
        )
        assert r.status_code == 202, r.text
    row = await db.fetchrow(
        "SELECT status FROM webhook_events_fallback WHERE provider_event_id = $1", event
    )
    assert row["status"] == "PENDING"
    # Its resend worker cannot publish either: the row stays PENDING, one attempt
    # counted, and waits out a backoff before the next try.
    await kafka_down.module(Betting).resender.run_once()
    row = await db.fetchrow(
        "SELECT status, attempts, leased_until FROM webhook_events_fallback"
        " WHERE provider_event_id = $1",
        event,
    )
    assert (row["status"], row["attempts"]) == ("PENDING", 1)
    assert row["leased_until"] > kafka_down.clock.now()
    # Kafka stays away for longer than any retry budget (the old one was 10): the
    # row is retried every time its backoff is over and never becomes FAILED.
    for _ in range(12):
        kafka_down.clock.advance(timedelta(seconds=61))  # the backoff's cap is 60 s
        await kafka_down.module(Betting).resender.run_once()
    row = await db.fetchrow(
        "SELECT status, attempts, leased_until FROM webhook_events_fallback"
        " WHERE provider_event_id = $1",
        event,
    )
    assert (row["status"], row["attempts"]) == ("PENDING", 13)
    assert row["leased_until"] - kafka_down.clock.now() <= timedelta(seconds=60)
    # A resend worker without Kafka hands it to the settlement handler.
    kafka_down.clock.advance(timedelta(seconds=61))
    await drain(container.module(Betting).resender, container.module(Outbox).relay)
    row = await db.fetchrow(
        "SELECT status FROM webhook_events_fallback WHERE provider_event_id = $1", event
    )
    assert row["status"] == "RESENT"
    settled = await db.fetchrow("SELECT status, payout FROM betting_bet WHERE id = $1", bet.id)
    assert (settled["status"], settled["payout"]) == ("WON", 420)
    assert await db.fetchval("SELECT balance FROM wallet_account WHERE id = $1", account) == 1_320


async def test_same_provider_event_through_kafka_handler_and_fallback_settles_once(
    client: httpx.AsyncClient, container: Container, db: asyncpg.Connection
) -> None:
    match = await make_match(client)
    account, _ = await make_account(client, 1_000)
    await container.module(Betting).service.place_bet(
        account, 100, [Leg(match["id"], "BTTS", "YES", Decimal("1.70"))]
    )
    event = f"prov-{uuid.uuid4()}"
    body = result_body(match["externalId"], 1, 1, event=event)
    kick_off(container.clock, match)
    # -> fallback (no Kafka here)
    assert (await post_result(client, body, container.clock)).status_code == 202
    import orjson

    payload = orjson.loads(body)
    kafka_event = Event(
        betting_events.result_event_id(event),
        betting_events.RESULT_TOPIC,
        match["externalId"],
        payload,
        datetime.now(UTC),
    )
    # What the Kafka consumer group calls, twice (redelivery), and the fallback path.
    await asyncio.gather(
        container.module(Betting).settlement.handle(kafka_event),
        container.module(Betting).settlement.handle(kafka_event),
        container.module(Betting).resender.run_once(),
    )
    await drain(container.module(Betting).resender, container.module(Outbox).relay)
    assert await db.fetchval("SELECT balance FROM wallet_account WHERE id = $1", account) == 1_070
    m = await db.fetchrow(
        "SELECT settled_bets, settlement_status FROM betting_match WHERE id = $1", match["id"]
    )
    assert (m["settled_bets"], m["settlement_status"]) == (1, "SETTLED")


async def test_settlement_killed_mid_chunk_resumes_and_pays_once(
    client: httpx.AsyncClient, container: Container, db: asyncpg.Connection
) -> None:
    match = await make_match(client)
    other = await make_match(client)
    accounts = [await make_account(client, 10_000) for _ in range(10)]
    bets = []
    for i in range(300):
        account = accounts[i % 10][0]
        legs = [
            Leg(
                match["id"],
                "1X2",
                ["HOME", "DRAW", "AWAY"][i % 3],
                Decimal(["1.80", "3.40", "4.20"][i % 3]),
            )
        ]
        if i % 4 == 0:  # some accumulators whose other leg is already decided below
            legs.append(Leg(other["id"], "BTTS", "NO", Decimal("2.10")))
        bets.append(await container.module(Betting).service.place_bet(account, 10 + i, legs))
    # The other match finished 0-0 (BTTS NO wins) and is fully settled first.
    kick_off(container.clock, match, other)  # results count only once a match started
    async with container.db.transaction() as conn:
        other_id = await container.module(Betting).settlement.accept_in_tx(
            conn,
            {
                "matchExternalId": other["externalId"],
                "homeScore": 0,
                "awayScore": 0,
                "status": "FINISHED",
                "providerEventId": f"prov-{uuid.uuid4()}",
            },
        )
    await container.module(Betting).settlement.settle(other_id)
    async with container.db.transaction() as conn:
        await container.module(Betting).settlement.accept_in_tx(
            conn,
            {
                "matchExternalId": match["externalId"],
                "homeScore": 2,
                "awayScore": 0,
                "status": "FINISHED",
                "providerEventId": f"prov-{uuid.uuid4()}",
            },
        )
    small = Settlement(container.db, container.clock, chunk=15, parallel=2, house_shards=8)
    task = asyncio.create_task(small.settle(match["id"]))
    progress = "SELECT settled_bets FROM betting_match WHERE id = $1"
    for _ in range(2000):  # poll the progress PostgreSQL shows, as an operator would
        if await db.fetchval(progress, match["id"]) >= 60:
            break
        await asyncio.sleep(0.005)
    task.cancel()  # killed wherever it is: inside a chunk's transaction most likely
    with pytest.raises(asyncio.CancelledError):
        await task
    state = await db.fetchrow(
        "SELECT settlement_status, settled_bets FROM betting_match WHERE id = $1", match["id"]
    )
    assert state["settlement_status"] == "SETTLING" and 60 <= state["settled_bets"] < 300
    # Paid as settled, before any relay ran: a winning bet is credited by the very
    # transaction that settled it, and nothing is left to the payout consumer.
    ids = [b.id for b in bets]
    won_so_far = await db.fetch(
        "SELECT 'bet:' || id AS reference, payout FROM betting_bet"
        " WHERE id = ANY($1) AND status = 'WON' ORDER BY id",
        ids,
    )
    assert won_so_far
    credited = await db.fetch(
        "SELECT reference, amount AS payout FROM wallet_transfer"
        " WHERE kind = 'PAYOUT' AND reference = ANY($1) ORDER BY to_account_id, reference",
        [f"bet:{i}" for i in ids],
    )
    assert sorted(map(tuple, credited)) == sorted(map(tuple, won_so_far))
    # The sweeper (another worker) resumes.
    await container.module(Betting).settlement.sweep()
    await drain(container.module(Betting).resender, container.module(Outbox).relay)
    state = await db.fetchrow(
        "SELECT settlement_status, settled_bets FROM betting_match WHERE id = $1", match["id"]
    )
    assert (state["settlement_status"], state["settled_bets"]) == ("SETTLED", 300)
    rows = await db.fetch(
        "SELECT id, account_id, stake, status, payout FROM betting_bet WHERE id = ANY($1)", ids
    )
    expected_total = 0
    for r in rows:
        i = ids.index(r["id"])
        home = i % 3 == 0
        assert r["status"] == ("WON" if home else "LOST")
        if home:
            odds = Decimal("1.80") * (Decimal("2.10") if i % 4 == 0 else 1)
            assert r["payout"] == int(r["stake"] * odds)
            expected_total += r["payout"]
    paid = await db.fetch(
        "SELECT reference, count(*) AS n, sum(amount) AS total FROM wallet_transfer"
        " WHERE kind = 'PAYOUT' AND reference = ANY($1) GROUP BY reference",
        [f"bet:{i}" for i in ids],
    )
    assert all(p["n"] == 1 for p in paid)
    assert len(paid) == sum(1 for r in rows if r["status"] == "WON")
    assert sum(p["total"] for p in paid) == expected_total
    # Notifications: one item per settled bet across the chunk events, none twice.
    items = await db.fetch(
        "SELECT (b->>'betId')::bigint AS bet"
        " FROM outbox o, jsonb_array_elements(o.payload->'bets') b"
        " WHERE o.topic = $1 AND (o.payload->>'matchId')::bigint = $2",
        betting_events.BETS_SETTLED,
        match["id"],
    )
    assert sorted(r["bet"] for r in items) == sorted(ids)
    # A duplicated payout request (a new event with the same items) pays nothing more.
    before = await db.fetchval(
        "SELECT sum(balance) FROM wallet_account WHERE id = ANY($1)", [a for a, _ in accounts]
    )
    assert not await db.fetchval(
        "SELECT count(*) FROM outbox WHERE topic = $1"
        " AND (payload->'items'->0->>'accountId')::bigint = ANY($2)",
        PAYOUT_REQUESTED,
        [a for a, _ in accounts],
    )
    won = [r for r in rows if r["status"] == "WON"]
    await container.module(Wallet).payouts.handle(
        Event(
            uuid.uuid4(),
            PAYOUT_REQUESTED,
            "dup",
            payout_request(
                [Payout("PAYOUT", f"bet:{r['id']}", r["account_id"], r["payout"]) for r in won],
                0,
            ),
            datetime.now(UTC),
        )
    )
    after = await db.fetchval(
        "SELECT sum(balance) FROM wallet_account WHERE id = ANY($1)", [a for a, _ in accounts]
    )
    assert before == after
