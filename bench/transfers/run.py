"""HTTP transfers among N accounts (issue 11), on real processes.

N customer accounts (default 1,000) are seeded with deposits by SQL; wrk then
drives ``POST /api/transfers`` against ``reservo api --workers W`` between random
distinct pairs, each request as the owner of the source account (their own bettor
JWT, as docs/openapi.json requires) with a fresh Idempotency-Key. Afterwards PostgreSQL is
asked whether the bank still holds:

- the sum of all balances is 0 (WORLD is minus what was deposited) and the
  customers still hold exactly what was deposited: money moved, never created;
- no customer balance is negative;
- every transfer has exactly two entries summing to zero, and every account's
  balance is the last ``balanceAfter`` of its entries and the sum of their amounts;
- every stored 201 under an Idempotency-Key names a transfer that exists, no
  two keys name the same transfer, and there are as many such keys as transfers
  made by the run (at least as many as the 201s wrk saw).

    python bench/transfers/run.py --accounts 1000 --duration 10 --runs 3
    python bench/transfers/run.py --duration 10 --connections 64,128 --profile /tmp/t.raw

Exits 1 on any 5xx or broken invariant. The payouts benchmark is ``payouts.py``.
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

# A database of its own: other benchmarks truncate theirs.
os.environ.setdefault("BENCH_DB", "reservo_bench_transfers")
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from accounts import seed

import benchlib
from reservo.core.http.auth import mint_token

HERE = Path(__file__).resolve().parent
BALANCE = 1_000_000
ENDPOINT = "POST /api/transfers"

_CHECKS = {
    "balance_sum": "SELECT coalesce(sum(balance), 0) FROM wallet_account",
    "customer_sum": "SELECT coalesce(sum(balance), 0) FROM wallet_account WHERE kind = 'CUSTOMER'",
    "negative": "SELECT count(*) FROM wallet_account WHERE kind = 'CUSTOMER' AND balance < 0",
    "transfers": "SELECT count(*) FROM wallet_transfer WHERE kind = 'TRANSFER'",
    # Transfers without exactly two entries summing to zero.
    "unbalanced": """
        SELECT count(*) FROM wallet_transfer t
         WHERE (SELECT count(*) FROM wallet_entry e WHERE e.transfer_id = t.id) <> 2
            OR (SELECT sum(amount) FROM wallet_entry e WHERE e.transfer_id = t.id) <> 0""",
    # Accounts whose balance is not their ledger (sum, and the newest balance_after).
    "ledger_mismatch": """
        SELECT count(*) FROM wallet_account a
          LEFT JOIN LATERAL (SELECT coalesce(sum(amount), 0) AS s FROM wallet_entry
                              WHERE account_id = a.id) e ON true
          LEFT JOIN LATERAL (SELECT balance_after FROM wallet_entry WHERE account_id = a.id
                              ORDER BY id DESC LIMIT 1) l ON true
         WHERE a.balance <> e.s OR a.balance <> coalesce(l.balance_after, 0)""",
    "keys_201": f"""SELECT count(*) FROM idempotency_key
                     WHERE endpoint = '{ENDPOINT}' AND response_status = 201""",
    # Stored 201s naming no transfer, or the same transfer as another key.
    "keys_dangling": f"""
        SELECT count(*) FROM idempotency_key k
          LEFT JOIN wallet_transfer t ON t.id = (k.response_body->>'id')::bigint
         WHERE k.endpoint = '{ENDPOINT}' AND k.response_status = 201 AND t.id IS NULL""",
    "keys_shared": f"""
        SELECT count(*) - count(DISTINCT response_body->>'id') FROM idempotency_key
         WHERE endpoint = '{ENDPOINT}' AND response_status = 201""",
}


@dataclass
class RunResult:
    workers: int
    threads: int
    connections: int
    transfers_per_s: float
    requests: int
    statuses: dict[str, int]
    p50_ms: float
    p90_ms: float
    p99_ms: float
    max_ms: float
    socket_errors: dict[str, int]
    peak_rss_mb: float
    created_201: int
    accounts: int
    facts: dict[str, int]
    waits: dict[str, int]
    errors_logged: int
    cpu: dict[str, float]

    @property
    def failures(self) -> list[str]:
        f, bad = self.facts, []
        n5xx = _count(self, "5")
        if n5xx:
            bad.append(f"{n5xx} responses were 5xx")
        if f["balance_sum"] != 0:
            bad.append(f"the balances sum to {f['balance_sum']}, not 0")
        if f["customer_sum"] != self.accounts * BALANCE:
            bad.append(f"customers hold {f['customer_sum']}, deposited {self.accounts * BALANCE}")
        for name in ("negative", "unbalanced", "ledger_mismatch", "keys_dangling", "keys_shared"):
            if f[name]:
                bad.append(f"{name}: {f[name]}")
        if f["keys_201"] != f["transfers"]:
            bad.append(f"{f['transfers']} transfers but {f['keys_201']} stored 201s")
        if f["transfers"] < self.created_201:
            bad.append(f"wrk saw {self.created_201} 201s but {f['transfers']} transfers exist")
        return bad


async def prepare(accounts: int) -> list[tuple[int, int]]:
    """A fresh ledger: (account id, owner id) of every customer account."""
    await benchlib._ensure_database()
    conn = await benchlib.connect()
    try:
        await conn.execute(
            "TRUNCATE wallet_entry, wallet_transfer, wallet_pending_transfer, wallet_account, "
            "idempotency_key, "
            "outbox, inbox RESTART IDENTITY"
        )
    finally:
        await conn.close()
    await seed(benchlib.db_url(), accounts, BALANCE)
    conn = await benchlib.connect()
    try:
        rows = await conn.fetch(
            "SELECT id, owner_id FROM wallet_account WHERE kind = 'CUSTOMER' ORDER BY id"
        )
        return [(r["id"], r["owner_id"]) for r in rows]
    finally:
        await conn.close()


async def check() -> dict[str, int]:
    conn = await benchlib.connect()
    try:
        return {name: int(await conn.fetchval(sql)) for name, sql in _CHECKS.items()}
    finally:
        await conn.close()


def mint_owners(path: Path, accounts: list[tuple[int, int]]) -> Path:
    """``<account id> <JWT of its owner>`` per line, for transfers.lua."""
    now = datetime.now(UTC)
    with path.open("w") as f:
        for account_id, owner in accounts:
            token = mint_token(benchlib.JWT_SECRET, "bettor", owner, timedelta(hours=6), now)
            f.write(f"{account_id} {token}\n")
    return path


def one_run(
    opts: argparse.Namespace, workers: int, threads: int, connections: int, prof: Path | None
) -> RunResult:
    accounts = benchlib.run_async(prepare(opts.accounts))
    tokens = mint_owners(Path(tempfile.mkdtemp(prefix="reservo-transfers-")) / "t.txt", accounts)
    env = {"RESERVO_DB_POOL_MAX": str(opts.pool_max)} if opts.pool_max else {}
    script = HERE / "transfers.lua"
    with benchlib.Reservo(workers, env) as rv:
        if opts.warmup > 0:
            # Warm-up transfers count in the ledger checks like the measured ones.
            warm = benchlib.run_wrk(
                script, rv.base, threads, connections, opts.warmup, [str(tokens), "warm", "500"]
            )
            time.sleep(0.5)
        args = [str(tokens), f"run{time.time_ns()}", str(opts.max_amount)]
        d = benchlib.drive(
            rv, script, threads, connections, opts.duration, args, prof, sample_waits=True
        )
    # Checked once the processes stopped: requests still in flight when wrk
    # stopped have finished (or rolled back) by then.
    facts = benchlib.run_async(check())
    errors = rv.error_lines()
    for line in errors[:5]:
        print(f"  logged: {line[:200]}", file=sys.stderr)
    res = d.wrk
    return RunResult(
        workers=workers,
        threads=threads,
        connections=connections,
        transfers_per_s=res.count("201") / res.duration_s,
        requests=res.requests,
        statuses=dict(sorted(res.statuses.items())),
        p50_ms=res.p50_ms,
        p90_ms=res.p90_ms,
        p99_ms=res.p99_ms,
        max_ms=res.max_ms,
        socket_errors=res.socket_errors,
        peak_rss_mb=d.mem.peak_rss / 2**20,
        created_201=res.count("201") + (warm.count("201") if opts.warmup > 0 else 0),
        accounts=opts.accounts,
        facts=facts,
        waits=dict(d.waits),
        errors_logged=len(errors),
        cpu=d.cpu.figures(res.requests, res.wrk_cpu_s),
    )


def _count(r: RunResult, prefix: str) -> int:
    return sum(n for k, n in r.statuses.items() if k.startswith(prefix))


def describe(r: RunResult) -> str:
    errs = f"  socket errors {r.socket_errors}" if r.socket_errors else ""
    f = r.facts
    return (
        f"workers={r.workers} wrk -t{r.threads} -c{r.connections}: "
        f"{r.transfers_per_s:,.0f} transfers/s ({r.requests:,} requests), "
        f"p50 {r.p50_ms:.1f} ms, p90 {r.p90_ms:.1f} ms, p99 {r.p99_ms:.1f} ms, "
        f"max {r.max_ms:.0f} ms{errs}\n"
        f"  statuses: {r.statuses}\n"
        f"  bank: {f['transfers']} transfers, balances sum {f['balance_sum']}, customers "
        f"{f['customer_sum']}, negative {f['negative']}, unbalanced {f['unbalanced']}, "
        f"ledger mismatches {f['ledger_mismatch']}; keys: {f['keys_201']} stored 201s, "
        f"dangling {f['keys_dangling']}, shared {f['keys_shared']}\n"
        f"  PostgreSQL backends (pg_stat_activity samples): "
        f"{benchlib.describe_waits(benchlib.Counter(r.waits))}\n"
        f"  peak RSS of reservo processes {r.peak_rss_mb:.0f} MB; "
        f"{benchlib.describe_cpu(r.cpu)}"
    )


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--duration", type=float, default=10, help="seconds per run")
    p.add_argument("--accounts", type=int, default=1000)
    p.add_argument("--max-amount", type=int, default=500, help="amounts are 1..this")
    p.add_argument("--workers", default="2", help="API worker counts to compare, e.g. 1,2,3")
    p.add_argument("--threads", default="2", help="wrk threads, e.g. 1,2")
    p.add_argument("--connections", default="64", help="wrk connections, e.g. 64,128")
    p.add_argument("--runs", type=int, default=1, help="runs per configuration (median)")
    p.add_argument("--warmup", type=float, default=2, help="seconds of warm-up transfers")
    p.add_argument("--profile", type=Path, help="py-spy raw profile of one API worker, run 1")
    p.add_argument("--pool-max", type=int, default=10, help="RESERVO_DB_POOL_MAX (0: default)")
    benchlib.add_ceiling_option(p)
    p.add_argument("--json", type=Path, help="append every run's figures to this file")
    p.add_argument("--drop-db", action="store_true", help="drop the database at the end")
    opts = p.parse_args(argv)
    benchlib.stop_cleanly_on_signals()
    print(f"machine: {benchlib.machine()}")
    print(f"reservo code under test: {benchlib.reservo_source()}")

    def rate(r: Any) -> float:
        return float(r.transfers_per_s)

    configs, results, ceilings = benchlib.sweep(
        opts, "transfers", lambda w, t, c, prof: one_run(opts, w, t, c, prof), describe, rate
    )
    print(f"\nmedians over {opts.runs} run(s) of {opts.duration:.0f} s:")
    print("workers  wrk         transfers/s  p50 ms  p99 ms  409%  5xx  reservo CPU ms/req")
    med = benchlib.median
    for w, t, c in configs:
        rs = [r for r in results if (r.workers, r.threads, r.connections) == (w, t, c)]
        refused = med([100 * _count(r, "409") / max(1, r.requests) for r in rs])
        n5xx = sum(_count(r, "5") for r in rs)
        cpu = med([r.cpu["cpu_ms_per_req_reservo"] for r in rs])
        print(
            f"{w:>7}  -t{t} -c{c:<4} {med([rate(r) for r in rs]):>11,.0f}  "
            f"{med([r.p50_ms for r in rs]):>6.1f}  {med([r.p99_ms for r in rs]):>6.1f}  "
            f"{refused:>4.1f}  {n5xx:>3}  {cpu:>18.2f}"
        )
    benchlib.ceiling_summary(configs, results, ceilings, rate, "transfers/s")
    failures = [f"{r.workers}w/-c{r.connections}: {f}" for r in results for f in r.failures]
    return benchlib.finish(
        failures, opts.drop_db, "zero 5xx; money conserved, no negative balance, ledger exact"
    )


if __name__ == "__main__":
    sys.exit(main())
