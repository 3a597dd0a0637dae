"""The CSV statement's memory (issue 27): constant for 1,000,000 entries.

An account's ledger is seeded by SQL (default 1,000,000 entries on one UTC day,
plus a second account of 100,000 for comparison); then
``GET /api/accounts/{id}/statement.csv`` is streamed through a real
``reservo api`` process (one worker) and read in 64 KiB pieces, while a thread
samples the API process's RSS every 20 ms. Reported per download: RSS before,
peak during, after, bytes, lines, seconds. The claim holds when the peak for
1,000,000 entries is about the peak for 100,000 (nothing grows with the
statement) and far below the body's size.

    python bench/statement/run.py                      # 1,000,000 and 100,000
    python bench/statement/run.py --entries 200000 --small 20000

Exits 1 when a download is incomplete or its last balance is not the ledger's.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import sys
import threading
import time
import urllib.request
from datetime import UTC, datetime, timedelta
from pathlib import Path

import psutil

# A database of its own: other benchmarks truncate theirs.
os.environ.setdefault("BENCH_DB", "reservo_bench_statement")
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import benchlib
from reservo.core.http.auth import mint_token

DAY = datetime(2031, 6, 1, tzinfo=UTC)
OWNER_BASE = 9_100_000_000


async def seed(entries: int, owner: int) -> tuple[int, int]:
    """A customer account with ``entries`` ledger lines on DAY (ids in order, a
    running balance), written in SQL; returns (account id, final balance)."""
    conn = await benchlib.connect()
    try:
        account = await conn.fetchval(
            "INSERT INTO wallet_account (owner_id, currency, kind, shard, created_at) "
            "VALUES ($1, 'EUR', 'CUSTOMER', 0, $2) RETURNING id",
            owner,
            DAY,
        )
        await conn.execute(
            """
            INSERT INTO wallet_entry (account_id, transfer_id, amount, balance_after, kind,
                                      reference, created_at)
            SELECT $1, g, 1 + g % 97, sum(1 + g % 97) OVER (ORDER BY g), 'DEPOSIT',
                   'deposit-' || g, $3::timestamptz + g * interval '10 milliseconds'
              FROM generate_series(1, $2::int) AS g
            """,
            account,
            entries,
            DAY,
        )
        balance = int(
            await conn.fetchval(
                "SELECT balance_after FROM wallet_entry WHERE account_id = $1 "
                "ORDER BY id DESC LIMIT 1",
                account,
            )
        )
        await conn.execute("UPDATE wallet_account SET balance = $2 WHERE id = $1", account, balance)
        await conn.execute("ANALYZE wallet_entry")
        return account, balance
    finally:
        await conn.close()


class RssSampler(threading.Thread):
    def __init__(self, proc: psutil.Process) -> None:
        super().__init__(daemon=True)
        self.proc, self.peak, self.stop = proc, 0, threading.Event()

    def run(self) -> None:
        while not self.stop.is_set():
            self.peak = max(self.peak, self.proc.memory_info().rss)
            time.sleep(0.02)


def download(base: str, account: int, owner: int, proc: psutil.Process) -> dict[str, float]:
    token = mint_token(benchlib.JWT_SECRET, "bettor", owner, timedelta(hours=1), datetime.now(UTC))
    day = DAY.date().isoformat()
    req = urllib.request.Request(
        f"{base}/api/accounts/{account}/statement.csv?from={day}&to={day}",
        headers={"Authorization": f"Bearer {token}"},
    )
    before = proc.memory_info().rss
    sampler = RssSampler(proc)
    sampler.start()
    started = time.perf_counter()
    size = lines = 0
    tail = b""
    with urllib.request.urlopen(req, timeout=600) as r:
        while piece := r.read(65536):
            size += len(piece)
            lines += piece.count(b"\n")  # CRLF may straddle two pieces
            tail = (tail + piece)[-512:]
    took = time.perf_counter() - started
    sampler.stop.set()
    sampler.join()
    last = tail.rstrip(b"\r\n").rsplit(b"\r\n", 1)[-1].split(b",")
    return {
        "rss_before": before,
        "rss_peak": max(sampler.peak, before),
        "rss_after": proc.memory_info().rss,
        "bytes": size,
        "lines": lines,
        "seconds": took,
        "last_balance": int(last[4]),
    }


def mib(n: float) -> str:
    return f"{n / 2**20:.1f} MiB"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--entries", type=int, default=1_000_000)
    ap.add_argument("--small", type=int, default=100_000)
    args = ap.parse_args()
    asyncio.run(benchlib.drop_database())  # a fresh ledger every run
    asyncio.run(benchlib._ensure_database())
    owner = OWNER_BASE + int(time.time()) % 1_000_000
    t0 = time.perf_counter()
    big, big_balance = asyncio.run(seed(args.entries, owner))
    small, small_balance = asyncio.run(seed(args.small, owner + 1))
    print(f"seeded {args.entries:,} + {args.small:,} entries in {time.perf_counter() - t0:.1f} s")
    failed = False
    with benchlib.Reservo(workers=1) as reservo:
        proc = reservo.api_workers()[0]
        for name, account, who, n, balance in (
            ("small", small, owner + 1, args.small, small_balance),
            ("large", big, owner, args.entries, big_balance),
            ("small again", small, owner + 1, args.small, small_balance),
        ):
            m = download(reservo.base, account, who, proc)
            ok = m["lines"] == n + 1 and m["last_balance"] == balance
            failed |= not ok
            print(
                f"{name:>12}: {n:>9,} entries, {mib(m['bytes'])} in {m['seconds']:.1f} s "
                f"({n / m['seconds']:,.0f} rows/s); API RSS before {mib(m['rss_before'])}, "
                f"peak {mib(m['rss_peak'])} (+{mib(m['rss_peak'] - m['rss_before'])}), "
                f"after {mib(m['rss_after'])}{'' if ok else f'  INCOMPLETE {m}'}"
            )
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
