"""Wallet benchmarks.

1. Transfers/s through HTTP (a real ``reservo api`` server, N processes) among
   10,000 accounts: random pairs, each request with its own Idempotency-Key.
2. The payout path's rate into the house account: single payouts (one
   transaction each) on ONE house sub-account vs spread over 8 sub-accounts, vs
   batched chunks (one transaction moves the house balance once per chunk).

    python bench/transfers/run.py --seconds 20 --api-workers 2 --concurrency 64
"""

from __future__ import annotations

import argparse
import asyncio
import atexit
import os
import random
import shutil
import statistics
import subprocess
import sys
import time
import uuid
from datetime import timedelta

import asyncpg
import httpx

from reservo.core.auth import mint_token
from reservo.core.clock import SystemClock
from reservo.core.db import Database
from reservo.core.migrate import migrate
from reservo.wallet.service import Payout, pay_many_in_tx, transfer_in_tx

JWT = "bench-jwt-secret-0123456789abcdef0123"


async def seed(url: str, accounts: int, balance: int) -> list[int]:
    conn = await asyncpg.connect(url)
    await conn.execute(
        f"""INSERT INTO wallet_account (owner_id, currency, kind, shard, created_at)
            SELECT NULL::bigint, 'EUR', 'WORLD', 0, now()
            UNION ALL SELECT NULL, 'EUR', 'HOUSE', g, now() FROM generate_series(0, 7) g;
            INSERT INTO wallet_account (owner_id, currency, created_at)
            SELECT 5000000 + g, 'EUR', now() FROM generate_series(1, {accounts}) g;"""
    )
    world = await conn.fetchval("SELECT id FROM wallet_account WHERE kind = 'WORLD'")
    # Seed balances as real deposits (a transfer and two entries each).
    await conn.execute(
        f"""WITH t AS (
              INSERT INTO wallet_transfer (kind, reference, from_account_id, to_account_id,
                                           amount, created_at)
              SELECT 'DEPOSIT', 'seed-' || id, {world}, id, {balance}, now()
                FROM wallet_account WHERE kind = 'CUSTOMER'
              RETURNING id, to_account_id, amount)
            INSERT INTO wallet_entry (account_id, transfer_id, amount, balance_after, kind,
                                      reference, created_at)
            SELECT to_account_id, id, amount, amount, 'DEPOSIT', 'seed', now() FROM t
            UNION ALL
            SELECT {world}, id, -amount, -{balance}::bigint * (row_number() OVER (ORDER BY id)),
                   'DEPOSIT', 'seed', now() FROM t;
            UPDATE wallet_account SET balance = {balance} WHERE kind = 'CUSTOMER';
            UPDATE wallet_account SET balance = -{balance}::bigint * {accounts}
             WHERE id = {world};"""
    )
    await conn.execute("VACUUM ANALYZE")
    ids = [
        r["id"] for r in await conn.fetch("SELECT id FROM wallet_account WHERE kind = 'CUSTOMER'")
    ]
    await conn.close()
    return ids


async def http_transfers(
    base: str, ids: list[int], seconds: float, concurrency: int
) -> tuple[int, int, list[float]]:
    owners = {i: 5000000 + n + 1 for n, i in enumerate(ids)}
    tokens: dict[int, str] = {}
    now = SystemClock().now()

    def tok(owner: int) -> str:
        if owner not in tokens:
            tokens[owner] = mint_token(JWT, "bettor", owner, timedelta(hours=1), now)
        return tokens[owner]

    ok = refused = 0
    latencies: list[float] = []
    stop = time.perf_counter() + seconds
    rng = random.Random(7)

    async with httpx.AsyncClient(
        base_url=base, timeout=30, limits=httpx.Limits(max_connections=concurrency)
    ) as client:

        async def loop() -> None:
            nonlocal ok, refused
            while time.perf_counter() < stop:
                a, b = rng.sample(ids, 2)
                t = time.perf_counter()
                r = await client.post(
                    "/api/transfers",
                    json={"fromAccountId": a, "toAccountId": b, "amount": rng.randint(1, 500)},
                    headers={
                        "Authorization": f"Bearer {tok(owners[a])}",
                        "Idempotency-Key": str(uuid.uuid4()),
                    },
                )
                latencies.append(time.perf_counter() - t)
                if r.status_code == 201:
                    ok += 1
                elif r.status_code == 409:
                    refused += 1
                else:
                    raise SystemExit(f"unexpected {r.status_code} {r.text}")

        await asyncio.gather(*(loop() for _ in range(concurrency)))
    return ok, refused, latencies


async def payouts(url: str, ids: list[int], n: int, mode: str, concurrency: int = 32) -> float:
    db = Database(url, min_size=concurrency, max_size=concurrency + 2)
    clock = SystemClock()
    async with db.connection() as conn:
        houses = [
            r["id"]
            for r in await conn.fetch(
                "SELECT id FROM wallet_account WHERE kind = 'HOUSE' ORDER BY shard"
            )
        ]
    tag = uuid.uuid4().hex[:6]
    rng = random.Random(11)
    items = [Payout("PAYOUT", f"{mode}-{tag}-{i}", rng.choice(ids), 1 + i % 500) for i in range(n)]
    t = time.perf_counter()
    if mode == "batched":
        chunk = 1000
        queue = [items[i : i + chunk] for i in range(0, n, chunk)]

        async def worker_b(shard: int) -> None:
            while queue:
                part = queue.pop()
                async with db.transaction() as conn:
                    await pay_many_in_tx(conn, part, 0, 8, clock.now())

        await asyncio.gather(*(worker_b(0) for _ in range(4)))
    else:
        queue2 = list(items)

        async def worker_s() -> None:
            while queue2:
                p = queue2.pop()
                house = houses[0] if mode == "single-1-house" else houses[p.account_id % 8]
                async with db.transaction() as conn:
                    await transfer_in_tx(
                        conn, house, p.account_id, p.amount, "PAYOUT", p.reference, clock.now()
                    )

        await asyncio.gather(*(worker_s() for _ in range(concurrency)))
    elapsed = time.perf_counter() - t
    await db.close()
    return n / elapsed


async def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--pg", default="postgresql://postgres@127.0.0.1:5432/postgres")
    ap.add_argument("--redis", default="redis://127.0.0.1:6379/0")
    ap.add_argument("--accounts", type=int, default=10_000)
    ap.add_argument("--seconds", type=float, default=20)
    ap.add_argument("--concurrency", type=int, default=64)
    ap.add_argument("--api-workers", type=int, default=2)
    ap.add_argument("--payouts", type=int, default=20_000)
    ap.add_argument("--port", type=int, default=8765)
    ap.add_argument(
        "--embedded",
        action="store_true",
        help="run on a PostgreSQL of its own (when the shared one is saturated)",
    )
    args = ap.parse_args()
    if args.embedded:
        import tempfile
        from pathlib import Path

        from reservo.core.embedded import EmbeddedPostgres

        scratch = Path(tempfile.mkdtemp(prefix="reservo-bench-wallet-"))
        embedded = EmbeddedPostgres(scratch)
        # Stopped and removed on exit: a 500k-bet cluster is over 1 GB.
        atexit.register(shutil.rmtree, scratch, True)
        atexit.register(embedded.stop)
        args.pg = embedded.start()
    name = f"reservo_bench_wallet_{uuid.uuid4().hex[:8]}"
    admin = await asyncpg.connect(args.pg)
    await admin.execute(f'CREATE DATABASE "{name}"')
    await admin.close()
    url = f"{args.pg.rpartition('/')[0]}/{name}"
    await migrate(url)
    ids = await seed(url, args.accounts, 1_000_000)
    env = {
        **os.environ,
        "RESERVO_DATABASE_URL": url,
        "RESERVO_REDIS_URL": args.redis,
        "RESERVO_REDIS_NAMESPACE": name,
        "RESERVO_JWT_SECRET": JWT,
        "RESERVO_LOG_LEVEL": "WARNING",
        "RESERVO_DB_POOL_MAX": "20",
    }
    api = subprocess.Popen(  # noqa: ASYNC220 - started once, before timing
        [
            sys.executable,
            "-m",
            "reservo.cli",
            "api",
            "--port",
            str(args.port),
            "--workers",
            str(args.api_workers),
        ],
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        base = f"http://127.0.0.1:{args.port}"
        for _ in range(100):
            try:
                if httpx.get(f"{base}/healthz").status_code == 200:  # noqa: ASYNC210
                    break
            except httpx.HTTPError:
                pass
            await asyncio.sleep(0.2)
        await http_transfers(base, ids, 2, args.concurrency)  # warm-up
        ok, refused, lat = await http_transfers(base, ids, args.seconds, args.concurrency)
    finally:
        api.terminate()
        api.wait(30)
    lat.sort()
    print(
        f"HTTP transfers among {args.accounts} accounts, {args.api_workers} API processes, "
        f"{args.concurrency} concurrent clients, {args.seconds:.0f} s:\n"
        f"  {ok / args.seconds:,.0f} transfers/s  ({ok} ok, {refused} refused)  "
        f"p50 {statistics.median(lat) * 1000:.1f} ms  p99 {lat[int(len(lat) * 0.99)] * 1000:.1f} ms"
    )
    conn = await asyncpg.connect(url)
    total = await conn.fetchval("SELECT sum(balance) FROM wallet_account")
    negative = await conn.fetchval(
        "SELECT count(*) FROM wallet_account WHERE kind = 'CUSTOMER' AND balance < 0"
    )
    await conn.close()
    print(f"  invariants: sum of all balances {total} (must be 0), negative customers {negative}")
    for mode in ("single-1-house", "single-8-houses", "batched"):
        rate = await payouts(url, ids, args.payouts, mode)
        print(f"  payouts into the house, {mode:16s}: {rate:,.0f} payouts/s")
    admin = await asyncpg.connect(args.pg)
    await admin.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
    await admin.close()


if __name__ == "__main__":
    asyncio.run(main())
