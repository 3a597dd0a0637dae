"""Wallet payouts: the payout path's rate into the house account, in process:
single payouts (one transaction each) on ONE house sub-account vs spread over 8
sub-accounts, vs batched chunks (one transaction moves the house balance once per
chunk). HTTP transfers are measured by ``run.py`` beside this file.

    python bench/transfers/payouts.py --payouts 20000
"""

from __future__ import annotations

import argparse
import asyncio
import atexit
import random
import shutil
import time
import uuid

import asyncpg

from reservo.core.clock import SystemClock
from reservo.core.db import Database
from reservo.core.migrate import migrate
from reservo.wallet.service import Payout, pay_many_in_tx, transfer_in_tx


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
    ap.add_argument("--accounts", type=int, default=10_000)
    ap.add_argument("--payouts", type=int, default=20_000)
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
    for mode in ("single-1-house", "single-8-houses", "batched"):
        rate = await payouts(url, ids, args.payouts, mode)
        print(f"payouts into the house, {mode:16s}: {rate:,.0f} payouts/s")
    admin = await asyncpg.connect(args.pg)
    await admin.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
    await admin.close()


if __name__ == "__main__":
    asyncio.run(main())
