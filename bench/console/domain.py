"""Page times of the console's clinic, rentals and betting pages on big tables.

    .venv/bin/python bench/console/domain.py [--requests 30] [--fresh]

The clinic pages read the appointments benchmark's database (``reservo_bench``,
1,120,000 slots; only read). The rentals and betting pages read a database of
their own, ``reservo_bench_console_domain``, seeded once (kept for the next run;
``--fresh`` seeds it again): 10,000 cars with 500,000 bookings, and 60 matches
with 5,000,000 single bets, two of the matches settling. Each page is served
in-process (httpx's ASGI transport), signed in as admin, and timed as
``bench/console/run.py`` does."""

from __future__ import annotations

import argparse
import asyncio
import re
import statistics
import sys
import time
from datetime import timedelta
from pathlib import Path

import asyncpg
import httpx

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchlib import JWT_SECRET, NAMESPACE, PG_ADMIN_URL, REDIS_URL, SECRET_SETTINGS, db_url
from reservo.app import create_app
from reservo.bootstrap import build
from reservo.core.db.migrate import migrate
from reservo.core.http.auth import mint_token
from reservo.core.kernel.clock import SystemClock
from reservo.settings import Settings

DOMAIN_DB = "reservo_bench_console_domain"
CARS, BOOKINGS, MATCHES, BETS = 10_000, 500_000, 60, 5_000_000

SEED = f"""
INSERT INTO car (plate, model, city, daily_price, host_id, created_at)
SELECT 'B-' || g, 'Fiat Uno', 'city-' || g % 50, 5000 + g % 100 * 100, 1 + g % 2000, now()
  FROM generate_series(1, {CARS}) g;
-- Car 1 + g % CARS, trip k = g / CARS of it: two days every three, a 2 h buffer; the
-- past ones COMPLETED or CANCELLED, the future ones CONFIRMED, the last HOLD.
INSERT INTO booking (car_id, customer_id, period, return_at, status, deposit_amount,
                     hold_expires_at, created_at, updated_at)
SELECT c.id, 1 + g % 100000,
       tstzrange(t, t + interval '50 hours', '[)'), t + interval '48 hours',
       CASE WHEN t < now() THEN (ARRAY['COMPLETED', 'CANCELLED'])[1 + g % 2]
            WHEN k = {BOOKINGS // CARS} - 1 THEN 'HOLD' ELSE 'CONFIRMED' END,
       3000, CASE WHEN k = {BOOKINGS // CARS} - 1 THEN now() + interval '1 day' END,
       t - interval '30 days', t - interval '30 days'
  FROM (SELECT g, g / {CARS} AS k, (SELECT min(id) FROM car) + g % {CARS} AS car,
               date_trunc('day', now()) - interval '100 days'
                 + (g / {CARS}) * interval '3 days' AS t
          FROM generate_series(0, {BOOKINGS} - 1) g) x JOIN car c ON c.id = x.car;
-- Matches 1-50 started without a result, 51-52 settling, 53-60 settled.
INSERT INTO betting_match (external_id, home, away, starts_at, odds, created_at, result_status,
                           home_score, away_score, result_at, settlement_status, settled_bets)
SELECT 'bench-' || g, 'H' || g, 'A' || g, now() - g * interval '2 minutes',
       '{{"1X2": {{"HOME": "1.80", "DRAW": "3.40", "AWAY": "4.20"}}}}'::jsonb, now(),
       CASE WHEN g > 50 THEN 'FINISHED' END, CASE WHEN g > 50 THEN 1 END,
       CASE WHEN g > 50 THEN 0 END, CASE WHEN g > 50 THEN now() END,
       CASE WHEN g > 52 THEN 'SETTLED' WHEN g > 50 THEN 'SETTLING' ELSE 'OPEN' END,
       CASE WHEN g > 50 THEN 40000 ELSE 0 END
  FROM generate_series(1, {MATCHES}) g;
INSERT INTO betting_bet (account_id, owner_id, currency, stake, potential_payout, created_at)
SELECT 1 + g % 20000, 1 + g % 20000, 'EUR', 100, 180, now()
  FROM generate_series(1, {BETS}) g;
-- One leg each, on matches 1-52 (about 96,000 pending legs per match).
INSERT INTO betting_selection (bet_id, match_id, market, pick, odds)
SELECT b.id, m.first + b.id % 52, '1X2', 'HOME', 1.80
  FROM betting_bet b, (SELECT min(id) AS first FROM betting_match) m;
"""


async def ensure_seeded(fresh: bool) -> None:
    admin = await asyncpg.connect(PG_ADMIN_URL)
    try:
        if fresh:
            await admin.execute(f'DROP DATABASE IF EXISTS "{DOMAIN_DB}"')
        if not await admin.fetchval("SELECT 1 FROM pg_database WHERE datname = $1", DOMAIN_DB):
            await admin.execute(f'CREATE DATABASE "{DOMAIN_DB}"')
    finally:
        await admin.close()
    await migrate(db_url(DOMAIN_DB))
    conn = await asyncpg.connect(db_url(DOMAIN_DB))
    try:
        if await conn.fetchval("SELECT EXISTS (SELECT 1 FROM betting_bet)"):
            return
        t = time.perf_counter()
        await conn.execute(SEED)
        await conn.execute("VACUUM ANALYZE")
        print(f"seeded {DOMAIN_DB} in {time.perf_counter() - t:.0f} s", flush=True)
    finally:
        await conn.close()


async def pages_of(db: str) -> list[str]:
    """The pages to time, on rows that exist in ``db``."""
    conn = await asyncpg.connect(db_url(db))
    try:
        if db != DOMAIN_DB:
            slot = await conn.fetchrow(
                "SELECT s.id, s.doctor_id, s.start_at FROM time_slot s"
                " WHERE s.booked_count > 0 ORDER BY s.id LIMIT 1"
            ) or await conn.fetchrow("SELECT id, doctor_id, start_at FROM time_slot LIMIT 1")
            day = slot["start_at"].date().isoformat()
            return [
                f"/console/clinic?doctor={slot['doctor_id']}&day={day}",
                f"/console/clinic/slots/{slot['id']}/waitlist",
            ]
        car = await conn.fetchval("SELECT min(id) FROM car")
        customer = await conn.fetchval(
            "SELECT customer_id FROM booking GROUP BY 1 ORDER BY count(*) DESC LIMIT 1"
        )
        return [
            f"/console/rentals?car={car}&days=31",
            f"/console/rentals/bookings?customer={customer}",
            f"/console/rentals/bookings?customer={customer}&status=CONFIRMED",
            "/console/betting?status=STARTED",
            "/console/betting?status=SETTLED",
            "/console/betting?status=UPCOMING",
        ]
    finally:
        await conn.close()


async def time_pages(db: str, requests: int) -> None:
    settings = Settings(
        database_url=db_url(db),
        redis_url=REDIS_URL,
        redis_namespace=f"{NAMESPACE}:console",
        **SECRET_SETTINGS,
        log_json=False,
    )
    container = build(settings)
    app = create_app(container, owns_container=False)
    token = mint_token(JWT_SECRET, "admin", 1, timedelta(hours=1), SystemClock().now())
    transport = httpx.ASGITransport(app=app)
    async with httpx.AsyncClient(transport=transport, base_url="http://bench.test") as client:
        form = await client.get("/console/sign-in")
        nonce = re.search(r'name="nonce" value="([^"]+)"', form.text)
        assert nonce is not None
        signed = await client.post("/console/sign-in", data={"token": token, "nonce": nonce[1]})
        assert signed.status_code == 303, signed.text
        for path in await pages_of(db):
            times = []
            for _ in range(requests):
                t = time.perf_counter()
                r = await client.get(path)
                times.append((time.perf_counter() - t) * 1000)
                assert r.status_code == 200, r.text
            times.sort()
            print(
                f"{db} {path}: p50 {statistics.median(times):.1f} ms  "
                f"p95 {times[int(len(times) * 0.95) - 1]:.1f} ms  max {times[-1]:.1f} ms",
                flush=True,
            )
    await container.close()


async def main(requests: int, fresh: bool) -> None:
    await ensure_seeded(fresh)
    await time_pages("reservo_bench", requests)
    await time_pages(DOMAIN_DB, requests)


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--requests", type=int, default=30)
    parser.add_argument("--fresh", action="store_true")
    args = parser.parse_args()
    asyncio.run(main(args.requests, args.fresh))
