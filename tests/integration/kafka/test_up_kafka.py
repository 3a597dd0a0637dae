"""`reservo up --kafka` as a real process, with its own embedded Kafka-protocol
broker (Tansu): every consumer group runs, so a match result is settled and its
payout credited, and a rental cancellation's refund is executed (sandbox gateway),
end to end through Kafka. (It once started only the ``notifications`` group.)"""

from __future__ import annotations

import asyncio
import time
import uuid
from datetime import UTC, datetime, timedelta
from pathlib import Path

import asyncpg
import httpx
import orjson
import psutil

from reservo.core.http.auth import sign_webhook
from reservo.settings import Settings
from tests.helpers.auth import ADMIN, PAY_SECRET, RESULTS_SECRET, SERVICE, auth, new_id
from tests.helpers.betting import place, result_body
from tests.helpers.procs import env_for, free_port, running, wait_http


async def _until(db: asyncpg.Connection, sql: str, *args: object, want: object) -> None:
    deadline = time.monotonic() + 45
    while (got := await db.fetchval(sql, *args)) != want:
        assert time.monotonic() < deadline, f"{sql} {args}: {got!r}, wanted {want!r}"
        await asyncio.sleep(0.1)


def _at(hours: float) -> str:
    t = datetime.now(UTC) + timedelta(hours=hours)
    return t.replace(second=0, microsecond=0).isoformat()


async def test_up_with_kafka_settles_pays_and_refunds(
    base_settings: Settings, own_database: str, tmp_path: Path
) -> None:
    port = free_port()
    settings = base_settings.with_(
        database_url=own_database,
        redis_namespace=f"{base_settings.redis_namespace}-up-{uuid.uuid4().hex[:6]}",
    )
    env = env_for(
        settings,
        RESERVO_DATA_DIR=str(tmp_path / "data"),  # the embedded broker lives here
        RESERVO_HTTP_PORT=str(port),
        RESERVO_OUTBOX_POLL_INTERVAL_S="0.05",
        RESERVO_KAFKA_SESSION_TIMEOUT_MS="6000",
    )
    env.pop("RESERVO_KAFKA_BOOTSTRAP", None)  # `--kafka` then starts its own broker
    log = tmp_path / "up.log"
    base = f"http://127.0.0.1:{port}"
    db = await asyncpg.connect(own_database)
    broker: int | None = None
    try:
        with running(["up", "--kafka"], env, log) as proc:
            await asyncio.to_thread(wait_http, f"{base}/readyz", proc, log, 60)
            async with httpx.AsyncClient(base_url=base, timeout=10) as client:
                # Sportsbook: a bet, then, once the match started, the result
                # webhook (straight to Kafka).
                kick_off = datetime.now(UTC) + timedelta(seconds=3)
                r = await client.post(
                    "/api/matches",
                    headers=ADMIN,
                    json={
                        "externalId": f"ext-{uuid.uuid4()}",
                        "home": "Porto",
                        "away": "Benfica",
                        "startsAt": kick_off.isoformat(),
                        "odds": {
                            "1X2": {"HOME": "1.80", "DRAW": "3.40", "AWAY": "4.20"},
                            "TOTALS_2_5": {"OVER": "1.95", "UNDER": "1.85"},
                            "BTTS": {"YES": "1.70", "NO": "2.10"},
                        },
                    },
                )
                assert r.status_code == 201, r.text
                match = r.json()
                owner = new_id()
                r = await client.post(
                    "/api/accounts", json={"ownerId": owner, "currency": "EUR"}, headers=ADMIN
                )
                assert r.status_code == 201, r.text
                account = int(r.json()["id"])
                r = await client.post(
                    f"/api/accounts/{account}/deposits",
                    json={"amount": 1_000, "reference": f"dep-{uuid.uuid4()}"},
                    headers={**SERVICE, "Idempotency-Key": str(uuid.uuid4())},
                )
                assert r.status_code == 201, r.text
                r = await place(client, account, owner, 200, [(match["id"], "TOTALS_2_5", "OVER")])
                assert r.status_code == 201, r.text
                await asyncio.sleep((kick_off - datetime.now(UTC)).total_seconds() + 0.2)
                body = result_body(match["externalId"], 3, 2)
                r = await client.post(
                    "/api/webhooks/match-results",
                    content=body,
                    headers={
                        "X-Signature": sign_webhook(RESULTS_SECRET, body),
                        "Content-Type": "application/json",
                    },
                )
                assert r.status_code == 202, r.text

                # Rentals: a confirmed booking cancelled 100 h before pickup (full refund).
                r = await client.post(
                    "/api/cars",
                    headers=ADMIN,
                    json={
                        "plate": f"T-{uuid.uuid4().hex[:10]}",
                        "model": "Fiat Uno",
                        "city": f"city-{new_id()}",
                        "dailyPrice": 10_000,
                        "hostId": new_id(),
                    },
                )
                assert r.status_code == 201, r.text
                customer = new_id()
                r = await client.post(
                    "/api/bookings",
                    headers={**auth("customer", customer), "Idempotency-Key": str(uuid.uuid4())},
                    json={
                        "carId": r.json()["id"],
                        "customerId": customer,
                        "from": _at(100),
                        "to": _at(124),
                    },
                )
                assert r.status_code == 201, r.text
                booking = r.json()
                raw = orjson.dumps(
                    {
                        "bookingId": booking["bookingId"],
                        "providerTxnId": f"txn-{uuid.uuid4().hex}",
                        "amount": booking["depositAmount"],
                        "status": "SUCCEEDED",
                    }
                )
                r = await client.post(
                    "/api/payments/webhook",
                    content=raw,
                    headers={
                        "X-Signature": sign_webhook(PAY_SECRET, raw, int(time.time())),
                        "Content-Type": "application/json",
                    },
                )
                assert r.json() == {"result": "confirmed"}, r.text
                r = await client.post(
                    f"/api/bookings/{booking['bookingId']}/cancel",
                    headers=auth("customer", customer),
                )
                assert r.status_code == 200 and r.json()["refundAmount"] > 0, r.text

            # Settled by the betting.settlement group, paid by the wallet.payouts group.
            await _until(
                db,
                "SELECT settlement_status FROM betting_match WHERE id = $1",
                match["id"],
                want="SETTLED",
            )
            await _until(
                db, "SELECT balance FROM wallet_account WHERE id = $1", account, want=800 + 390
            )
            # Refunded by the rentals-refunds group through the sandbox gateway.
            await _until(
                db,
                "SELECT amount FROM payment WHERE booking_id = $1 AND type = 'REFUND'",
                booking["bookingId"],
                want=booking["depositAmount"],
            )
            assert proc.poll() is None, log.read_text()
            # Every one of those went through Kafka: nothing waited in the fallback table.
            assert await db.fetchval("SELECT count(*) FROM webhook_events_fallback") == 0
            broker = int((tmp_path / "data" / "kafka" / "tansu.pid").read_text())
        # SIGTERM stops everything cleanly, the embedded broker included.
        assert proc.returncode == 0, log.read_text()
        assert not _alive(broker)
    finally:
        await db.close()
        if broker is not None and _alive(broker):
            psutil.Process(broker).kill()  # never leave a broker of ours behind


def _alive(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False
