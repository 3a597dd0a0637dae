"""Rentals at the design note's holiday peak, on real processes.

20,000 cars in 20 cities are loaded by SQL. Then, against `reservo api --workers N`:

1. search: GET /api/cars for a random city and one of 10 periods (the Redis cache
   of 30 s serves most; misses run the NOT EXISTS query over ~1,000 cars).
2. holds: POST /api/bookings concentrated on 300 popular cars, each request from a
   fresh customer with its own Idempotency-Key; 201 or 409 car_unavailable.

Afterwards PostgreSQL is asked whether any two active bookings of a car overlap
(a self-join over HOLD/CONFIRMED/ON_TRIP); anything but 0 fails the run.

    python bench/rentals/run.py --duration 20

Exits 1 on any 5xx, socket error or overlap.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import sys
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

# A database of its own: other benchmarks truncate theirs.
os.environ.setdefault("BENCH_DB", "reservo_bench_rentals")
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
import asyncpg

import benchlib
from reservo.core.http.auth import mint_token

HERE = Path(__file__).resolve().parent
CARS, CITIES, POPULAR = 20_000, 20, 300
OVERLAPS = """
SELECT count(*) FROM booking a JOIN booking b
  ON a.car_id = b.car_id AND a.id < b.id AND a.period && b.period
 WHERE a.status IN ('HOLD', 'CONFIRMED', 'ON_TRIP')
   AND b.status IN ('HOLD', 'CONFIRMED', 'ON_TRIP')
"""


async def load() -> tuple[int, float]:
    """(first popular car id, seconds spent loading). Bookings of earlier runs go."""
    await benchlib._ensure_database()
    conn = await asyncpg.connect(benchlib.db_url())
    try:
        started = time.perf_counter()
        await conn.execute(
            "TRUNCATE payment, booking, idempotency_key, outbox, inbox, notification"
        )
        if await conn.fetchval("SELECT count(*) FROM car") != CARS:
            await conn.execute("TRUNCATE car RESTART IDENTITY CASCADE")
            await conn.execute(
                """
                INSERT INTO car (plate, model, city, daily_price, host_id, created_at)
                SELECT 'B-' || g, 'Model ' || (g % 37), format('city-%s', lpad((g % $2)::text,
                       2, '0')), 20000 + (g % 50) * 1000, 1000000 + g / 10, now()
                  FROM generate_series(1, $1) AS g
                """,
                CARS,
                CITIES,
            )
        await conn.execute("VACUUM ANALYZE car")
        await conn.execute("VACUUM ANALYZE booking")
        first = await conn.fetchval("SELECT min(id) FROM car")
        return int(first), time.perf_counter() - started
    finally:
        await conn.close()


async def check() -> dict[str, Any]:
    conn = await asyncpg.connect(benchlib.db_url())
    try:
        by_status = dict(await conn.fetch("SELECT status, count(*) FROM booking GROUP BY 1"))
        return {
            "overlaps": int(await conn.fetchval(OVERLAPS)),
            "bookings": {k: int(v) for k, v in by_status.items()},
            "cars_held": int(await conn.fetchval("SELECT count(DISTINCT car_id) FROM booking")),
        }
    finally:
        await conn.close()


def iso(t: datetime) -> str:
    return t.strftime("%Y-%m-%dT%H:%M:%SZ")


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--duration", type=float, default=20)
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--search-connections", type=int, default=64)
    ap.add_argument("--hold-connections", type=int, default=32)
    benchlib.add_ceiling_option(ap)
    a = ap.parse_args()
    print(f"machine: {benchlib.machine()}")
    print(f"reservo code under test: {benchlib.reservo_source()}")

    first_car, load_s = asyncio.run(load())
    benchlib.clear_redis_namespace()
    now = datetime.now(UTC)
    token = mint_token(benchlib.JWT_SECRET, "admin", 1, timedelta(hours=2), now)
    base = (now + timedelta(days=7)).replace(hour=8, minute=0, second=0, microsecond=0)
    periods = ",".join(
        f"{iso(base + timedelta(days=d))}/{iso(base + timedelta(days=d + 3, hours=12))}"
        for d in range(10)
    )
    days = ",".join(iso(base + timedelta(days=d)) for d in range(45))
    out: dict[str, Any] = {"cars": CARS, "cities": CITIES, "load_s": round(load_s, 2)}
    with benchlib.Reservo(a.workers, {"RESERVO_DB_POOL_MAX": "20"}) as r:
        # Warm-up: connections, statement caches, the search cache.
        benchlib.run_wrk(HERE / "search.lua", r.base, 2, 16, 3, [token, str(CITIES), periods])
        s = benchlib.run_wrk(
            HERE / "search.lua",
            r.base,
            a.threads,
            a.search_connections,
            a.duration,
            [token, str(CITIES), periods],
        )
        h = benchlib.run_wrk(
            HERE / "holds.lua",
            r.base,
            a.threads,
            a.hold_connections,
            a.duration,
            [token, str(first_car), str(POPULAR), days, str(int(time.time()) % 100000)],
        )
        errors = r.error_lines()
    db = asyncio.run(check())
    ceiling = None
    if a.ceiling_duration > 0:  # same workers, wrk threads and connections as the search
        ceiling = benchlib.hello_ceiling(
            a.workers, a.threads, a.search_connections, a.ceiling_duration
        )
    for name, w in (("search", s), ("holds", h)):
        out[name] = {
            "req_per_s": round(w.rate),
            "requests": w.requests,
            "statuses": w.statuses,
            "p50_ms": round(w.p50_ms, 2),
            "p90_ms": round(w.p90_ms, 2),
            "p99_ms": round(w.p99_ms, 2),
            "max_ms": round(w.max_ms, 2),
            "socket_errors": w.socket_errors,
            "wrk_cpu_s": round(w.wrk_cpu_s, 1),
        }
    if ceiling is not None:
        out["ceiling"] = {
            "hello_req_per_s": round(ceiling.per_s),
            "p99_ms": round(ceiling.p99_ms, 2),
            "load_avg_before": round(ceiling.load_avg, 2),
            "search_ratio": round(ceiling.ratio(s.rate), 3),
            "holds_ratio": round(ceiling.ratio(h.rate), 3),
        }
    out["database"] = db
    out["logged_errors"] = errors[:5]
    print(json.dumps(out, indent=2))
    print(
        f"search {s.rate:,.0f} req/s (p99 {s.p99_ms:.1f} ms), holds {h.rate:,.0f}/s "
        f"(p99 {h.p99_ms:.1f} ms), overlapping active bookings {db['overlaps']}"
    )
    if ceiling is not None:
        print(ceiling.describe(s.rate, "search"))
        print(f"holds {h.rate:,.0f}/s, ratio {ceiling.ratio(h.rate):.2f} of the same ceiling")
    bad = (
        db["overlaps"] != 0
        or any(k.startswith("5") for w in (s, h) for k in w.statuses)
        or bool(s.socket_errors or h.socket_errors)
    )
    return 1 if bad else 0


if __name__ == "__main__":
    raise SystemExit(main())
