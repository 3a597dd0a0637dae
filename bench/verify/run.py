"""`reservo verify` on a large database: the settlement benchmark's builder
(bench/settlement/run.py's seed: N bets on one match, M unrelated pending
bets, their legs and accounts), then the command itself, timed, with the peak
RSS of its process (bounded memory: it reads keyset pages, never a table).

    python bench/verify/run.py --bets 500000 --unrelated 0
    python bench/verify/run.py --bets 500000 --unrelated 4500000   # 5 M bets
    python bench/verify/run.py --db reservo_bench_verify_xxxx      # again, no seeding
"""

from __future__ import annotations

import argparse
import asyncio
import importlib.util
import json
import os
import resource
import subprocess
import sys
import time
import uuid
from pathlib import Path

import asyncpg

from reservo.core.db.migrate import migrate

HERE = Path(__file__).resolve().parent


def _settlement_seed() -> object:
    """The settlement benchmark's builder, loaded from its file (bench/ is no package)."""
    spec = importlib.util.spec_from_file_location("settle_run", HERE.parent / "settlement/run.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.seed


async def build(pg: str, bets: int, unrelated: int, accounts: int) -> str:
    name = f"reservo_bench_verify_{uuid.uuid4().hex[:8]}"
    admin = await asyncpg.connect(pg)
    await admin.execute(f'CREATE DATABASE "{name}"')
    await admin.close()
    url = f"{pg.rpartition('/')[0]}/{name}"
    await migrate(url)
    t = time.perf_counter()
    await _settlement_seed()(url, bets, unrelated, accounts)  # type: ignore[operator]
    print(f"built {name} in {time.perf_counter() - t:.0f} s", flush=True)
    return name


def run_verify(url: str, page_size: int) -> tuple[float, dict[str, object], int]:
    """Wall seconds, the JSON report, and the peak RSS (KiB) of `reservo verify`."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("RESERVO_")}
    cmd = [
        sys.executable,
        "-m",
        "reservo.cli",
        "verify",
        "--json",
        "--database-url",
        url,
        "--page-size",
        str(page_size),
    ]
    t = time.perf_counter()
    done = subprocess.run(cmd, capture_output=True, text=True, env=env, check=False)
    wall = time.perf_counter() - t
    if done.returncode not in (0, 1):
        raise SystemExit(done.stderr)
    return wall, json.loads(done.stdout), resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss


async def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--pg", default="postgresql://postgres@127.0.0.1:5432/postgres")
    ap.add_argument("--bets", type=int, default=500_000)
    ap.add_argument("--unrelated", type=int, default=0)
    ap.add_argument("--accounts", type=int, default=20_000)
    ap.add_argument("--page-size", type=int, default=1000)
    ap.add_argument("--db", help="an existing database (one this script built): no seeding")
    ap.add_argument("--keep", action="store_true", help="keep the database afterwards")
    args = ap.parse_args()
    name = args.db or await build(args.pg, args.bets, args.unrelated, args.accounts)
    url = f"{args.pg.rpartition('/')[0]}/{name}"
    try:
        wall, report, rss_kib = run_verify(url, args.page_size)
        rows = {c["check"]: c["rowsChecked"] for c in report["checks"]}  # type: ignore[union-attr]
        print(
            f"reservo verify: {wall:.1f} s wall, ok={report['ok']}, peak RSS {rss_kib // 1024} MiB"
        )
        for check, n in rows.items():
            print(f"  {check:26} {n:>12,} rows")
        total = sum(rows.values())
        print(f"  {'total':26} {total:>12,} rows ({total / wall:,.0f} rows/s)")
    finally:
        if not (args.keep or args.db):
            admin = await asyncpg.connect(args.pg)
            await admin.execute(f'DROP DATABASE "{name}" WITH (FORCE)')
            await admin.close()


if __name__ == "__main__":
    asyncio.run(main())
