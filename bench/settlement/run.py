"""Settlement benchmark: N pending bets (mixed singles and accumulators) on one
match, optionally with M unrelated pending bets in the same tables.

Measures the time from the result webhook's 202 until every bet of the match is
settled, every payout is credited in the wallet and every settled-bet
notification event is delivered, and the peak RSS of the worker process
(``reservo worker --roles relay,results_resend``) doing it.

    python bench/settlement/run.py --bets 500000 --unrelated 0
    python bench/settlement/run.py --bets 500000 --unrelated 5000000
"""

from __future__ import annotations

import argparse
import asyncio
import atexit
import os
import shutil
import statistics
import subprocess
import sys
import time
import uuid
from datetime import UTC, datetime, timedelta

import asyncpg
import httpx
import psutil
from fastapi import FastAPI

from reservo.app import create_app
from reservo.bootstrap import build
from reservo.core.db.migrate import migrate
from reservo.core.http.auth import mint_token, sign_webhook
from reservo.settings import Settings

SECRET = "bench-results-secret-not-for-production-0123456789"
# The other secrets a reservo process refuses to start without (never used here).
OTHER_SECRETS = {
    "jwt_secret": "bench-jwt-secret-not-for-production-0123456789",
    "payments_webhook_secret": "bench-payments-secret-not-for-production-0123456789",
}


def backends(db: str) -> list[psutil.Process]:
    """The PostgreSQL backends serving the bench's database (their command line
    names it), for their CPU time."""
    found = []
    for p in psutil.process_iter(["name", "cmdline"]):
        cmd = " ".join(p.info["cmdline"] or ())
        if cmd.startswith("postgres:") and f" {db} " in cmd:
            found.append(p)
    return found


def cpu_s(procs: dict[int, psutil.Process], seen: dict[int, float]) -> float:
    """User + system CPU seconds of ``procs``, remembering each one's last reading
    (a backend that exits keeps its last figure)."""
    for pid, p in procs.items():
        try:
            t = p.cpu_times()
            seen[pid] = t.user + t.system
        except psutil.Error:
            pass
    return sum(seen.values())


async def seed(url: str, bets: int, unrelated: int, accounts: int) -> dict[str, int]:
    conn = await asyncpg.connect(url)
    await conn.execute(
        f"""
        INSERT INTO wallet_account (owner_id, currency, kind, shard, created_at)
        SELECT NULL::bigint, 'EUR', 'WORLD', 0, now()
        UNION ALL SELECT NULL, 'EUR', 'HOUSE', g, now() FROM generate_series(0, 7) g;
        INSERT INTO wallet_account (owner_id, currency, created_at)
        SELECT 1000000 + g, 'EUR', now() FROM generate_series(1, {accounts}) g;
        """
    )
    first_account = await conn.fetchval(
        "SELECT min(id) FROM wallet_account WHERE kind = 'CUSTOMER'"
    )
    odds = (
        '{"1X2": {"HOME": "1.80", "DRAW": "3.40", "AWAY": "4.20"},'
        ' "TOTALS_2_5": {"OVER": "1.95", "UNDER": "1.85"}, "BTTS": {"YES": "1.70", "NO": "2.10"}}'
    )
    # Match 1 is settled by the benchmark; 2 and 3 are already settled (legs WON/LOST);
    # 4..53 hold the unrelated pending bets.
    await conn.execute(
        f"""INSERT INTO betting_match (external_id, home, away, starts_at, odds, created_at,
                                       result_status, home_score, away_score, settlement_status)
            SELECT 'bench-' || g, 'H' || g, 'A' || g, now() - interval '2 hours', '{odds}'::jsonb,
                   now(), CASE WHEN g IN (2, 3) THEN 'FINISHED' END,
                   CASE WHEN g IN (2, 3) THEN 1 END, CASE WHEN g IN (2, 3) THEN 0 END,
                   CASE WHEN g IN (2, 3) THEN 'SETTLED' ELSE 'OPEN' END
              FROM generate_series(1, 53) g"""
    )
    mid = {
        r["external_id"]: r["id"]
        for r in await conn.fetch("SELECT id, external_id FROM betting_match")
    }
    target = mid["bench-1"]
    t = time.perf_counter()
    # Bets on the target match: 70 % singles, 30 % accumulators (2-3 legs; the
    # other legs already WON, or LOST for one in ten accumulators), each bet with
    # its count of legs, which settlement reads (a single is settled by grading).
    await conn.execute(
        f"""INSERT INTO betting_bet (account_id, owner_id, currency, stake, potential_payout,
                                     created_at, legs)
            SELECT {first_account} + g % {accounts}, 1000000 + 1 + g % {accounts}, 'EUR',
                   100 + g % 900, 0, now(), 1 + (g % 10 >= 7)::int + (g % 10 = 9)::int
              FROM generate_series(1, {bets}) g"""
    )
    lo = await conn.fetchval("SELECT min(id) FROM betting_bet")
    await conn.execute(
        f"""INSERT INTO betting_selection (bet_id, match_id, market, pick, odds)
            SELECT b, {target}, m, p, o FROM (
              SELECT {lo} + g - 1 AS b,
                     (ARRAY['1X2','TOTALS_2_5','BTTS'])[1 + g % 3] AS m,
                     CASE g % 3 WHEN 0 THEN (ARRAY['HOME','DRAW','AWAY'])[1 + (g / 3) % 3]
                                WHEN 1 THEN (ARRAY['OVER','UNDER'])[1 + (g / 3) % 2]
                                ELSE (ARRAY['YES','NO'])[1 + (g / 3) % 2] END AS p,
                     1.85 AS o
                FROM generate_series(1, {bets}) g) x;
            INSERT INTO betting_selection (bet_id, match_id, market, pick, odds, status)
            SELECT {lo} + g - 1, {mid["bench-2"]}, '1X2', 'HOME', 1.80,
                   CASE WHEN g % 100 < 3 THEN 'LOST' ELSE 'WON' END
              FROM generate_series(1, {bets}) g WHERE g % 10 >= 7;
            INSERT INTO betting_selection (bet_id, match_id, market, pick, odds, status)
            SELECT {lo} + g - 1, {mid["bench-3"]}, 'BTTS', 'NO', 2.10, 'WON'
              FROM generate_series(1, {bets}) g WHERE g % 10 = 9;"""
    )
    # Unrelated bets in slices of 1 M (one transaction each, with progress: 50 M take
    # a while), each bet with its one leg on one of 50 other open matches.
    done = 0
    while done < unrelated:
        n = min(1_000_000, unrelated - done)
        await conn.execute(
            f"""WITH b AS (
                  INSERT INTO betting_bet (account_id, owner_id, currency, stake,
                                           potential_payout, created_at)
                  SELECT {first_account} + g % {accounts}, 1000000 + 1 + g % {accounts}, 'EUR',
                         100, 0, now()
                    FROM generate_series({done + 1}, {done + n}) g
                  RETURNING id)
                INSERT INTO betting_selection (bet_id, match_id, market, pick, odds)
                SELECT id, {mid["bench-4"]} + id % 50, '1X2', 'HOME', 1.80 FROM b"""
        )
        done += n
        print(f"  unrelated {done:,}/{unrelated:,} ({time.perf_counter() - t:.0f} s)", flush=True)
    await conn.execute("VACUUM ANALYZE")
    # Write out what seeding and VACUUM dirtied (GBs at 5 M bets and more) now, so
    # that a checkpoint does not flush the load inside the timed settlement: a
    # server holding those bets in production has long written them.
    await conn.execute("CHECKPOINT")
    print(f"seeded {bets} + {unrelated} bets in {time.perf_counter() - t:.1f}s", flush=True)
    await conn.close()
    return {"target": target}


async def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--pg", default="postgresql://postgres@127.0.0.1:5432/postgres")
    ap.add_argument("--redis", default="redis://127.0.0.1:6379/0")
    ap.add_argument("--bets", type=int, default=500_000)
    ap.add_argument("--unrelated", type=int, default=0)
    ap.add_argument("--accounts", type=int, default=20_000)
    ap.add_argument("--chunk", type=int, default=5_000)
    ap.add_argument("--parallel", type=int, default=2)
    ap.add_argument("--keep", action="store_true")
    ap.add_argument(
        "--quiet-below",
        type=float,
        default=0.0,
        help="after seeding, wait until the 1-minute load average is below this before timing",
    )
    ap.add_argument(
        "--placements",
        type=int,
        default=2000,
        help="bets placed (16 at a time, in-process API) after the settlement, for latency",
    )
    ap.add_argument(
        "--correct",
        action="store_true",
        help="after the settlement, correct the match's result (POST .../resettle, 0-0)"
        " and time the reversal and the settlement again",
    )
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

    name = f"reservo_bench_settle_{uuid.uuid4().hex[:8]}"
    admin = await asyncpg.connect(args.pg)
    await admin.execute(f'CREATE DATABASE "{name}"')
    await admin.close()
    url = f"{args.pg.rpartition('/')[0]}/{name}"
    await migrate(url)
    ids = await seed(url, args.bets, args.unrelated, args.accounts)
    target = ids["target"]
    conn = await asyncpg.connect(url)
    expected_credits = await conn.fetchval(
        """SELECT count(*) FROM betting_bet b WHERE NOT EXISTS (
               SELECT 1 FROM betting_selection s WHERE s.bet_id = b.id AND s.status = 'LOST')
           AND EXISTS (SELECT 1 FROM betting_selection s
                        WHERE s.bet_id = b.id AND s.match_id = $1)""",
        target,
    )  # upper bound of winners before grading; the exact count is read after
    await wait_quiet(args.quiet_below)
    env = {
        **os.environ,
        "RESERVO_DATABASE_URL": url,
        "RESERVO_REDIS_URL": args.redis,
        "RESERVO_REDIS_NAMESPACE": name,
        "RESERVO_RESULTS_WEBHOOK_SECRET": SECRET,
        **{f"RESERVO_{name.upper()}": value for name, value in OTHER_SECRETS.items()},
        "RESERVO_BETTING_SETTLE_CHUNK": str(args.chunk),
        "RESERVO_BETTING_SETTLE_PARALLEL": str(args.parallel),
        "RESERVO_BETTING_RESEND_INTERVAL_S": "0.05",
        "RESERVO_OUTBOX_POLL_INTERVAL_S": "0.05",
        "RESERVO_OUTBOX_BATCH_SIZE": "20",
        "RESERVO_LOG_LEVEL": "WARNING",
    }
    worker = subprocess.Popen(  # noqa: ASYNC220 - started once, before timing
        [sys.executable, "-m", "reservo.cli", "worker", "--roles", "relay,results_resend"],
        env=env,
    )
    proc = psutil.Process(worker.pid)
    await asyncio.sleep(3)
    settings = Settings(
        database_url=url,
        redis_url=args.redis,
        results_webhook_secret=SECRET,
        redis_namespace=name,
        **OTHER_SECRETS,
    )
    container = build(settings)
    app = create_app(container)
    body = (
        '{"matchExternalId": "bench-1", "homeScore": 2, "awayScore": 1,'
        f' "status": "FINISHED", "providerEventId": "bench-{uuid.uuid4()}"}}'
    ).encode()
    peak = proc.memory_info().rss
    async with httpx.AsyncClient(
        transport=httpx.ASGITransport(app=app), base_url="http://bench"
    ) as client:
        r = await client.post(
            "/api/webhooks/match-results",
            content=body,
            headers={"X-Signature": sign_webhook(SECRET, body)},
        )
        t0 = time.perf_counter()
        assert r.status_code == 202, r.text
        load0 = os.getloadavg()
        pg_procs: dict[int, psutil.Process] = {}
        pg_base: dict[int, float] = {}
        pg_seen: dict[int, float] = {}
        worker_cpu0 = sum(proc.cpu_times()[:2])
        settled_at = paid_at = notified_at = None
        while True:
            peak = max(peak, proc.memory_info().rss)
            for p in backends(name):
                if p.pid not in pg_procs:
                    pg_procs[p.pid] = p
                    try:  # CPU spent before the result (pool warm-up) is not counted
                        pg_base[p.pid] = sum(p.cpu_times()[:2]) if now_s(t0) < 0.5 else 0.0
                    except psutil.Error:
                        pg_base[p.pid] = 0.0
            cpu_s(pg_procs, pg_seen)
            row = await conn.fetchrow(
                "SELECT settlement_status, settled_bets FROM betting_match WHERE id = $1", target
            )
            now = time.perf_counter() - t0
            if settled_at is None and row["settlement_status"] == "SETTLED":
                settled_at = now
            if settled_at is not None:
                pending = await conn.fetchrow(
                    """SELECT count(*) FILTER (WHERE topic = $1) AS pay,
                              count(*) FILTER (WHERE topic = $2) AS note
                         FROM outbox WHERE status = 'PENDING'""",
                    "wallet.account.payouts-requested.v1",
                    "betting.match.bets-settled.v1",
                )
                if paid_at is None and pending["pay"] == 0:
                    paid_at = now
                if notified_at is None and pending["note"] == 0:
                    notified_at = now
                if paid_at is not None and notified_at is not None:
                    break
            if now > 600:
                raise SystemExit(f"timeout; progress {dict(row)}")
            await asyncio.sleep(0.1)
    worker_cpu = sum(proc.cpu_times()[:2]) - worker_cpu0
    pg_cpu = cpu_s(pg_procs, pg_seen) - sum(pg_base.values())
    load1 = os.getloadavg()
    credited = await conn.fetchval(
        "SELECT count(*) FROM wallet_transfer WHERE kind IN ('PAYOUT', 'REFUND')"
    )
    winners = await conn.fetchval(
        "SELECT count(*) FROM betting_bet WHERE status IN ('WON', 'VOID') AND payout > 0"
    )
    unsettled = await conn.fetchval(
        """SELECT count(*) FROM betting_bet b JOIN betting_selection s ON s.bet_id = b.id
            WHERE s.match_id = $1 AND (b.status = 'PENDING' OR s.status = 'PENDING')""",
        target,
    )
    notes = await conn.fetchval(
        """SELECT coalesce(sum(jsonb_array_length(payload->'bets')), 0) FROM outbox
            WHERE topic = 'betting.match.bets-settled.v1' AND status = 'DONE'"""
    )
    # The wallet's invariants after the credits: money conserved (the seeded
    # accounts start at 0, so every balance sums to 0) and every balance its ledger.
    ledger = await conn.fetchrow(
        """SELECT sum(balance) AS total,
                  count(*) FILTER (WHERE balance <> coalesce(e.sum, 0)) AS off
             FROM wallet_account a
             LEFT JOIN (SELECT account_id, sum(amount) FROM wallet_entry GROUP BY 1) e
               ON e.account_id = a.id"""
    )
    total = max(settled_at or 0, paid_at or 0, notified_at or 0)
    disk = await conn.fetchrow(
        """SELECT pg_database_size(current_database()) AS db,
                  pg_total_relation_size('betting_bet')
                  + pg_total_relation_size('betting_selection') AS betting"""
    )
    # After the first settlement's figures are read; the worker's relay delivers
    # the correction's notifications.
    corrected = (
        await correct(app, conn, settings.jwt_secret, target) if args.correct else "not measured"
    )
    worker.terminate()
    worker.wait(30)
    placement = await place_bets(app, conn, settings.jwt_secret, args.placements)
    print(
        f"bets={args.bets} unrelated={args.unrelated} chunk={args.chunk} parallel={args.parallel}\n"
        f"  all bets settled      {settled_at:.2f} s  (unsettled left: {unsettled})\n"
        f"  all payouts credited  {paid_at:.2f} s  ({credited} credits for {winners} winning/void"
        f" bets, upper bound {expected_credits}; balances sum to {ledger['total']},"
        f" {ledger['off']} off their ledger)\n"
        f"  all notifications     {notified_at:.2f} s  ({notes} settled-bet notifications)\n"
        f"  total                 {total:.2f} s  = {args.bets / total * 60:,.0f} bets/min\n"
        f"  worker peak RSS       {peak / 2**20:.0f} MB\n"
        f"  CPU                   worker {worker_cpu:.1f} s, postgres backends {pg_cpu:.1f} s"
        f" ({len(pg_procs)} backends)\n"
        f"  load average          {load0[0]:.2f} at the start, {load1[0]:.2f} at the end\n"
        f"  on disk               database {disk['db'] / 2**30:.2f} GB, betting tables"
        f" {disk['betting'] / 2**30:.2f} GB\n"
        f"  bet placement         {placement}\n"
        f"  correction (0-0)      {corrected}",
        flush=True,
    )
    await conn.close()
    await container.close()
    if not args.keep:
        admin = await asyncpg.connect(args.pg)
        await admin.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
        await admin.close()


async def wait_quiet(below: float) -> None:
    """Wait (up to an hour) until the machine's 1-minute load average is below
    ``below``: seeding tens of millions of bets takes long, the timed part should
    not share the cores with whatever else ran meanwhile."""
    if below <= 0:
        return
    deadline = time.monotonic() + 3600
    while os.getloadavg()[0] >= below and time.monotonic() < deadline:
        print(f"  waiting for load < {below} (now {os.getloadavg()[0]:.2f})", flush=True)
        await asyncio.sleep(30)


async def place_bets(app: FastAPI, conn: asyncpg.Connection, secret: str, count: int) -> str:
    """Place ``count`` single bets on a new open match through the in-process API,
    16 at a time, after funding 64 accounts by deposit; the latency figures of
    placement at this table size."""
    if count <= 0:
        return "not measured"
    now = datetime.now(UTC)
    admin = mint_token(secret, "admin", 1, timedelta(hours=1), now)
    match_id = await conn.fetchval(
        """INSERT INTO betting_match (external_id, home, away, starts_at, odds, created_at)
           VALUES ('bench-open', 'H', 'A', now() + interval '1 day',
                   '{"1X2": {"HOME": "1.80", "DRAW": "3.40", "AWAY": "4.20"}}'::jsonb, now())
           RETURNING id"""
    )
    accounts = await conn.fetch(
        "SELECT id, owner_id FROM wallet_account WHERE kind = 'CUSTOMER' ORDER BY id LIMIT 64"
    )
    latencies: list[float] = []
    codes: dict[int, int] = {}
    async with httpx.AsyncClient(
        transport=httpx.ASGITransport(app=app), base_url="http://bench"
    ) as client:
        for a in accounts:
            r = await client.post(
                f"/api/accounts/{a['id']}/deposits",
                json={"amount": 10_000_000, "reference": f"bench-{a['id']}"},
                headers={"Authorization": f"Bearer {admin}", "Idempotency-Key": str(uuid.uuid4())},
            )
            assert r.status_code == 201, r.text
        tokens = [
            mint_token(secret, "bettor", a["owner_id"], timedelta(hours=1), now) for a in accounts
        ]
        queue = iter(range(count))

        async def one_client() -> None:
            for i in queue:
                a = accounts[i % len(accounts)]
                t = time.perf_counter()
                r = await client.post(
                    "/api/bets",
                    json={
                        "accountId": a["id"],
                        "stake": 100,
                        "selections": [
                            {"matchId": match_id, "market": "1X2", "pick": "HOME", "odds": "1.80"}
                        ],
                    },
                    headers={
                        "Authorization": f"Bearer {tokens[i % len(tokens)]}",
                        "Idempotency-Key": str(uuid.uuid4()),
                    },
                )
                latencies.append(time.perf_counter() - t)
                codes[r.status_code] = codes.get(r.status_code, 0) + 1

        t0 = time.perf_counter()
        await asyncio.gather(*(one_client() for _ in range(16)))
        wall = time.perf_counter() - t0
    latencies.sort()
    q = statistics.quantiles(latencies, n=100)
    return (
        f"{count} bets, {count / wall:,.0f}/s, p50 {q[49] * 1000:.1f} ms,"
        f" p99 {q[98] * 1000:.1f} ms, status codes {codes}"
    )


async def correct(app: FastAPI, conn: asyncpg.Connection, secret: str, target: int) -> str:
    """Correct the settled match to 0-0 through the in-process API (admin): the
    reopen (every payout reversed) answers 202, then the match settles again
    in this process's background; timed until SETTLED and the outbox drained."""
    admin = mint_token(secret, "admin", 1, timedelta(hours=1), datetime.now(UTC))
    async with httpx.AsyncClient(
        transport=httpx.ASGITransport(app=app), base_url="http://bench", timeout=600
    ) as client:
        t0 = time.perf_counter()
        r = await client.post(
            f"/api/matches/{target}/resettle",
            json={"result": {"status": "FINISHED", "homeScore": 0, "awayScore": 0}},
            headers={"Authorization": f"Bearer {admin}"},
        )
        assert r.status_code == 202, r.text
        reopened = time.perf_counter() - t0
        while True:
            status = await conn.fetchval(
                "SELECT settlement_status FROM betting_match WHERE id = $1", target
            )
            pending = await conn.fetchval("SELECT count(*) FROM outbox WHERE status = 'PENDING'")
            if status == "SETTLED" and pending == 0:
                break
            if time.perf_counter() - t0 > 900:
                raise SystemExit("correction timeout")
            await asyncio.sleep(0.1)
        total = time.perf_counter() - t0
    reversals = await conn.fetchval("SELECT count(*) FROM wallet_transfer WHERE kind = 'REVERSAL'")
    paid_again = await conn.fetchval(
        "SELECT count(*) FROM wallet_transfer WHERE kind IN ('PAYOUT', 'REFUND')"
        " AND reference LIKE 'bet:%:g2'"
    )
    negative = await conn.fetchval(
        "SELECT count(*) FROM wallet_account WHERE kind = 'CUSTOMER' AND balance < 0"
    )
    ledger = await conn.fetchrow(
        """SELECT sum(balance) AS total,
                  count(*) FILTER (WHERE balance <> coalesce(e.sum, 0)) AS off
             FROM wallet_account a
             LEFT JOIN (SELECT account_id, sum(amount) FROM wallet_entry GROUP BY 1) e
               ON e.account_id = a.id"""
    )
    return (
        f"reopened (202) in {reopened:.2f} s, settled again and notified in {total:.2f} s;"
        f" {reversals} reversals, {paid_again} paid in generation 2, {negative} accounts"
        f" below zero; balances sum to {ledger['total']}, {ledger['off']} off their ledger"
    )


def now_s(t0: float) -> float:
    return time.perf_counter() - t0


if __name__ == "__main__":
    asyncio.run(main())
