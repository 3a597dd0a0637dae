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
from accounts import seed

from reservo.core.db.database import Database
from reservo.core.db.migrate import migrate
from reservo.core.kernel.clock import SystemClock
from reservo.wallet.service import Payout, pay_many_in_tx, transfer_in_tx


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
