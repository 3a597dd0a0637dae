"""The settlement worker SIGKILLed mid-chunk: a second worker completes the
settlement with every bet settled once, every payout paid once and one
notification per bet."""

from __future__ import annotations

import asyncio
import signal
import uuid
from datetime import UTC, datetime, timedelta
from decimal import Decimal
from pathlib import Path

import asyncpg
import httpx

from reservo.app import create_app
from reservo.betting.domain import Leg
from reservo.betting.setup import Betting
from reservo.bootstrap import build
from reservo.core.kernel.clock import OffsetClock
from reservo.settings import Settings
from tests.helpers.betting import make_account, make_match, post_result, result_body
from tests.helpers.procs import env_for, running

BETS = 1_500
WORKER_ROLES = "results_resend,relay,settlement"


async def _wait_for(
    db: asyncpg.Connection, sql: str, *args: object, timeout_s: float = 60, until: object = True
) -> None:
    for _ in range(int(timeout_s / 0.01)):
        if await db.fetchval(sql, *args) == until:
            return
        await asyncio.sleep(0.01)
    raise TimeoutError(f"never true: {sql}")


async def test_settlement_worker_killed_mid_chunk_settles_and_pays_once(
    base_settings: Settings, own_database: str, tmp_path: Path
) -> None:
    settings = base_settings.with_(
        database_url=own_database,
        redis_namespace=f"{base_settings.redis_namespace}-kill-{uuid.uuid4().hex[:6]}",
    )
    container = build(settings, OffsetClock())
    db = await asyncpg.connect(own_database)
    try:
        app = create_app(container, owns_container=False)
        async with httpx.AsyncClient(
            transport=httpx.ASGITransport(app=app), base_url="http://reservo.test"
        ) as client:
            # The workers run in their own processes on the real clock: the match
            # really starts (in a few seconds) before its result is posted.
            match = await make_match(client, timedelta(seconds=20))
            accounts = [await make_account(client, 1_000_000) for _ in range(20)]
            picks = [("HOME", "1.80"), ("DRAW", "3.40"), ("AWAY", "4.20")]
            for i in range(BETS):
                pick, odds = picks[i % 3]
                await container.module(Betting).service.place_bet(
                    accounts[i % 20][0],
                    10 + i % 50,
                    [Leg(match["id"], "1X2", pick, Decimal(odds))],
                )
            starts = datetime.fromisoformat(match["startsAt"])
            await asyncio.sleep(max(0.0, (starts - datetime.now(UTC)).total_seconds() + 0.5))
            assert (
                await post_result(client, result_body(match["externalId"], 2, 0))
            ).status_code == 202
        before = {
            a: await db.fetchval("SELECT balance FROM wallet_account WHERE id = $1", a)
            for a, _ in accounts
        }

        env = env_for(
            settings,
            RESERVO_BETTING_SETTLE_CHUNK="10",
            RESERVO_BETTING_SETTLE_PARALLEL="1",
            RESERVO_BETTING_SWEEP_INTERVAL_S="0.3",
            RESERVO_BETTING_RESEND_INTERVAL_S="0.1",
            RESERVO_OUTBOX_POLL_INTERVAL_S="0.05",
        )
        progress = "SELECT settled_bets FROM betting_match WHERE id = $1"
        with running(["worker", "--roles", WORKER_ROLES], env, tmp_path / "w1.log") as first:
            await _wait_for(db, f"SELECT ({progress}) >= 100", match["id"])
            first.send_signal(signal.SIGKILL)
            first.wait(10)
        state = await db.fetchrow(
            "SELECT settlement_status, settled_bets FROM betting_match WHERE id = $1", match["id"]
        )
        assert state["settlement_status"] == "SETTLING"
        assert 100 <= state["settled_bets"] < BETS, "the kill must land mid-settlement"

        with running(["worker", "--roles", WORKER_ROLES], env, tmp_path / "w2.log"):
            await _wait_for(
                db,
                "SELECT settlement_status FROM betting_match WHERE id = $1",
                match["id"],
                until="SETTLED",
            )
            await _wait_for(db, "SELECT count(*) = 0 FROM outbox WHERE status <> 'DONE'")

        bets = await db.fetch(
            "SELECT id, account_id, stake, status, payout FROM betting_bet WHERE id IN"
            " (SELECT bet_id FROM betting_selection WHERE match_id = $1)",
            match["id"],
        )
        assert len(bets) == BETS
        assert all(b["status"] == ("WON" if b["payout"] else "LOST") for b in bets)
        won = {b["id"]: b for b in bets if b["status"] == "WON"}
        assert len(won) == BETS // 3
        assert all(b["payout"] == int(b["stake"] * Decimal("1.80")) for b in won.values())
        paid = await db.fetch(
            "SELECT reference, count(*) AS n, sum(amount) AS total FROM wallet_transfer"
            " WHERE kind = 'PAYOUT' GROUP BY reference"
        )
        assert {r["reference"] for r in paid} == {f"bet:{i}" for i in won}
        assert all(r["n"] == 1 for r in paid)
        for account, _ in accounts:
            mine = [b for b in bets if b["account_id"] == account]
            assert await db.fetchval(
                "SELECT balance FROM wallet_account WHERE id = $1", account
            ) == before[account] + sum(b["payout"] for b in mine)
        notes = await db.fetchval(
            "SELECT count(*) FROM notification WHERE topic = 'betting.match.bets-settled.v1'"
        )
        assert notes == BETS
    finally:
        await db.close()
        await container.close()
