"""The result fallback resender leases its rows: while it waits on Kafka it holds no
transaction and no row lock, another resender does not take the same rows, and
the rows of a resender that died mid-publish are resent once its lease has ended,
settled once."""

from __future__ import annotations

import asyncio
import contextlib
import uuid
from collections.abc import AsyncIterator
from datetime import timedelta
from decimal import Decimal

import asyncpg
import httpx
import pytest

from reservo.app import create_app
from reservo.betting.domain import Leg
from reservo.betting.publisher import TransportPublisher
from reservo.betting.resender import FallbackResender
from reservo.betting.setup import Betting
from reservo.bootstrap import Container, build
from reservo.core.db.database import Database
from reservo.core.kernel.clock import OffsetClock
from reservo.core.messaging.transport.kafka import KafkaTransport
from reservo.core_modules import Outbox
from reservo.settings import Settings
from tests.helpers.betting import kick_off, make_account, make_match, post_result, result_body
from tests.helpers.waiting import drain

STUCK = "reservo-resender-stuck"


@pytest.fixture
async def own(
    base_settings: Settings, own_database: str, clock: OffsetClock
) -> AsyncIterator[Container]:
    """A container on a database of the test's own (its resender takes every row)."""
    c = build(base_settings.with_(database_url=own_database), clock)
    yield c
    await c.close()


class Blackhole:
    """A "Kafka broker" that accepts connections and never answers: a publish to it
    hangs, as it does when a real broker stalls."""

    def __init__(self) -> None:
        self.connected = asyncio.Event()
        self.server: asyncio.Server | None = None

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.connected.set()
        with contextlib.suppress(ConnectionError):
            while await reader.read(65536):
                pass
        writer.close()

    async def __aenter__(self) -> str:
        self.server = await asyncio.start_server(self._serve, "127.0.0.1", 0)
        return f"127.0.0.1:{self.server.sockets[0].getsockname()[1]}"

    async def __aexit__(self, *exc: object) -> None:
        assert self.server is not None
        self.server.close()


def stuck_resender(
    url: str, bootstrap: str, c: Container, clock: OffsetClock, timeout_s: float, **kw: float
) -> tuple[FallbackResender, Database, KafkaTransport]:
    """A resender with a pool of its own (named, to find it in pg_stat_activity)
    publishing to ``bootstrap``."""
    db = Database(f"{url}?application_name={STUCK}", min_size=1, max_size=2)
    transport = KafkaTransport(
        bootstrap, idempotence=False, request_timeout_ms=int(timeout_s * 1000) + 5_000
    )
    publisher = TransportPublisher(transport, timeout_s)
    return (
        FallbackResender(db, clock, c.module(Betting).settlement, publisher=publisher, **kw),
        db,
        transport,
    )


async def test_blocked_publish_holds_no_transaction_and_a_crash_is_resent_once(
    own: Container, own_database: str, clock: OffsetClock
) -> None:
    c = own
    app = create_app(c, owns_container=False)
    async with httpx.AsyncClient(
        transport=httpx.ASGITransport(app=app), base_url="http://reservo.test"
    ) as client:
        match = await make_match(client)
        account, _ = await make_account(client, 1_000)
        bet = await c.module(Betting).service.place_bet(
            account, 100, [Leg(match["id"], "1X2", "AWAY", Decimal("4.20"))]
        )
        event = f"prov-{uuid.uuid4()}"
        kick_off(clock, match)
        r = await post_result(client, result_body(match["externalId"], 0, 3, event=event), clock)
        assert r.status_code == 202, r.text  # no Kafka here: held in the fallback table
    db = await asyncpg.connect(own_database)
    fallback = (
        "SELECT id, status, attempts FROM webhook_events_fallback WHERE provider_event_id = $1"
    )
    try:
        row_id = (await db.fetchrow(fallback, event))["id"]
        hole = Blackhole()
        async with hole as bootstrap:
            stuck, stuck_db, transport = stuck_resender(
                own_database, bootstrap, c, clock, timeout_s=60
            )
            publishing = asyncio.create_task(stuck.run_once())
            await asyncio.wait_for(hole.connected.wait(), 10)
            # The publish is in flight. The stuck resender's pool holds no transaction...
            states = [
                r["state"]
                for r in await db.fetch(
                    "SELECT state FROM pg_stat_activity WHERE application_name = $1", STUCK
                )
            ]
            assert states and all(s == "idle" for s in states), states
            # ...and no row lock: another session locks the row at once.
            async with db.transaction():
                assert await db.fetchval(
                    "SELECT id FROM webhook_events_fallback WHERE id = $1 FOR UPDATE NOWAIT",
                    row_id,
                )
            # The lease keeps another resender off the row.
            assert await c.module(Betting).resender.run_once() == 0
            assert tuple(await db.fetchrow(fallback, event)) == (row_id, "PENDING", 0)
            # The stuck resender dies mid-publish: its lease is never settled.
            publishing.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await publishing
            await transport.stop()
            await stuck_db.close()
        assert await c.module(Betting).resender.run_once() == 0  # still leased
        assert await db.fetchval("SELECT status FROM betting_bet WHERE id = $1", bet.id) == (
            "PENDING"
        )
        clock.advance(timedelta(seconds=c.settings.betting.resend_lease_s + 1))
        await drain(c.module(Betting).resender, c.module(Outbox).relay)
        # A second pass changes nothing.
        await drain(c.module(Betting).resender, c.module(Outbox).relay)
        assert tuple(await db.fetchrow(fallback, event)) == (row_id, "RESENT", 1)
        settled = await db.fetchrow("SELECT status, payout FROM betting_bet WHERE id = $1", bet.id)
        assert (settled["status"], settled["payout"]) == ("WON", 420)
        assert (
            await db.fetchval(
                "SELECT count(*) FROM wallet_transfer WHERE kind = 'PAYOUT' AND reference = $1",
                f"bet:{bet.id}",
            )
            == 1
        )
        assert await db.fetchval("SELECT balance FROM wallet_account WHERE id = $1", account) == (
            1_000 - 100 + 420
        )
        m = await db.fetchrow(
            "SELECT settled_bets, settlement_status FROM betting_match WHERE id = $1", match["id"]
        )
        assert (m["settled_bets"], m["settlement_status"]) == (1, "SETTLED")
    finally:
        await db.close()


async def test_rows_not_started_within_half_the_lease_go_back_unspent(
    own: Container, own_database: str, clock: OffsetClock
) -> None:
    """A slow broker cannot make a batch outlive its lease: rows not started within
    half of it are handed back without spending an attempt."""
    app = create_app(own, owns_container=False)
    async with httpx.AsyncClient(
        transport=httpx.ASGITransport(app=app), base_url="http://reservo.test"
    ) as client:
        match = await make_match(client)
        kick_off(clock, match)
        events = [f"prov-{uuid.uuid4()}" for _ in range(2)]
        for event in events:
            r = await post_result(
                client, result_body(match["externalId"], 1, 0, event=event), clock
            )
            assert r.status_code == 202, r.text
    hole = Blackhole()
    async with hole as bootstrap:
        slow, slow_db, transport = stuck_resender(
            own_database, bootstrap, own, clock, timeout_s=1.2, lease_s=2.0
        )
        try:
            assert await slow.run_once() == 2
        finally:
            await transport.stop()
            await slow_db.close()
    db = await asyncpg.connect(own_database)
    try:
        rows = await db.fetch(
            "SELECT status, attempts, leased_until, last_error FROM webhook_events_fallback"
            " WHERE provider_event_id = ANY($1::text[]) ORDER BY created_at",
            events,
        )
    finally:
        await db.close()
    # The first timed out (1.2 s, past half the 2 s lease): one attempt spent, and
    # it waits out a backoff (a transient failure) before anyone tries it again.
    assert (rows[0]["status"], rows[0]["attempts"]) == ("PENDING", 1)
    assert rows[0]["leased_until"] is not None
    assert "TimeoutError" in rows[0]["last_error"]
    # The second was never tried: free again at once, no attempt spent.
    assert (rows[1]["status"], rows[1]["attempts"], rows[1]["leased_until"]) == ("PENDING", 0, None)
    assert rows[1]["last_error"] is None
