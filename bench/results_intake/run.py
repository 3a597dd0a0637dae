"""Results intake benchmark: the sportsbook note's "500,000 settlements a minute,
a settlement being a result received for an event".

N distinct matches (default 500,000), each with a few pending bets: singles on it,
and one 3-leg accumulator starting at it (legs on matches g, g+1, g+2), so an
accumulator waits for several results. Seeded with generate_series straight in
PostgreSQL. Then one signed result webhook per match, each with its own body and
X-Signature, posted at a constant rate (open loop: request i is due at i / rate,
its latency counted from then, so a slow server is not hidden by a client that
waits for it) through the real path: webhook, Kafka or the fallback table,
settlement, wallet payouts, the settled-bet notifications through the outbox.

    python bench/results_intake/run.py --mode up --matches 50000 --rate 1000 --duration 30
    python bench/results_intake/run.py --mode deploy --rate 8333 --duration 60
    python bench/results_intake/run.py --mode deploy-kafka --rate 8333 --duration 60

Modes: ``up`` (`reservo up`, one process, no Kafka), ``deploy`` (`reservo api
--workers 2` + `reservo worker`, no Kafka: every result goes through the fallback
table), ``deploy-kafka`` (the same with an embedded Tansu broker).

Reports the intake (sent, 202s, sustained rate, p50/p99 from the due time), the
lag from each 202 to its match settled, to its winners paid and to its
notification published (p50, p99, max, and per 10-second bucket of arrival, to
see whether it grows), bets settled per minute, PostgreSQL CPU per result (the
backends serving the bench database, from /proc), and the invariants (each winner
paid once, ledger balanced, one inbox row per providerEventId, nothing left).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import io
import os
import sys
import threading
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path

import asyncpg
import psutil

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchlib import SECRETS_ENV, Reservo, machine
from reservo.core.db.migrate import migrate
from reservo.core.http.auth import sign_webhook

SECRET = SECRETS_ENV["RESERVO_RESULTS_WEBHOOK_SECRET"]
PATH = "/api/webhooks/match-results"
ODDS = (
    '{"1X2": {"HOME": "1.80", "DRAW": "3.40", "AWAY": "4.20"},'
    ' "TOTALS_2_5": {"OVER": "1.95", "UNDER": "1.85"}, "BTTS": {"YES": "1.70", "NO": "2.10"}}'
)
SETTLED_TOPIC = "betting.match.bets-settled.v1"
PAYOUT_TOPIC = "wallet.account.payouts-requested.v1"


# --- seeding ------------------------------------------------------------------


async def seed(url: str, matches: int, singles: int, accounts: int) -> None:
    """``matches`` started matches, ``singles`` single bets on each and one 3-leg
    accumulator per match (legs on g, g+1, g+2, wrapping), all pending."""
    t = time.perf_counter()
    conn = await asyncpg.connect(url)
    await conn.execute(
        f"""
        INSERT INTO wallet_account (owner_id, currency, kind, shard, created_at)
        SELECT NULL::bigint, 'EUR', 'WORLD', 0, now()
        UNION ALL SELECT NULL, 'EUR', 'HOUSE', g, now() FROM generate_series(0, 7) g;
        INSERT INTO wallet_account (owner_id, currency, created_at)
        SELECT 1000000 + g, 'EUR', now() FROM generate_series(1, {accounts}) g;
        INSERT INTO betting_match (external_id, home, away, starts_at, odds, created_at)
        SELECT 'r-' || g, 'H' || g, 'A' || g, now() - interval '2 hours', '{ODDS}'::jsonb, now()
          FROM generate_series(1, {matches}) g;
        """
    )
    first_account = await conn.fetchval("SELECT min(id) FROM wallet_account WHERE kind='CUSTOMER'")
    m0 = await conn.fetchval("SELECT min(id) FROM betting_match") - 1  # match g is m0 + g
    per = singles + 1  # bets per match: the singles, then the accumulator
    # Bet (g, k): k < singles a single on match g, k = singles the accumulator.
    await conn.execute(
        f"""INSERT INTO betting_bet (account_id, owner_id, currency, stake, potential_payout,
                                     created_at, legs)
            SELECT {first_account} + n % {accounts}, 1000000 + 1 + n % {accounts}, 'EUR',
                   100 + n % 900, 0, now(), CASE WHEN n % {per} = {singles} THEN 3 ELSE 1 END
              FROM generate_series(0, {matches * per} - 1) n"""
    )
    b0 = await conn.fetchval("SELECT min(id) FROM betting_bet")  # bet n is b0 + n
    await conn.execute(
        f"""INSERT INTO betting_selection (bet_id, match_id, market, pick, odds)
            SELECT {b0} + n, {m0} + 1 + n / {per}, '1X2',
                   (ARRAY['HOME','DRAW','AWAY'])[1 + n % 3], 1.85
              FROM generate_series(0, {matches * per} - 1) n WHERE n % {per} < {singles};
            INSERT INTO betting_selection (bet_id, match_id, market, pick, odds)
            SELECT {b0} + g * {per} + {singles}, {m0} + 1 + (g + leg) % {matches}, 'BTTS',
                   (ARRAY['YES','NO'])[1 + (g + leg) % 2], 1.30
              FROM generate_series(0, {matches} - 1) g, generate_series(0, 2) leg"""
    )
    await conn.execute("VACUUM ANALYZE")
    await conn.execute("CHECKPOINT")
    bets = await conn.fetchval("SELECT count(*) FROM betting_bet")
    legs = await conn.fetchval("SELECT count(*) FROM betting_selection")
    await conn.close()
    print(
        f"seeded {matches:,} matches, {bets:,} pending bets, {legs:,} legs"
        f" in {time.perf_counter() - t:.1f} s",
        flush=True,
    )


def result_body(g: int, run: str) -> bytes:
    """Match g's result: 1 in 100 cancelled (its legs VOID), else a score."""
    if g % 100 == 0:
        return (
            f'{{"matchExternalId":"r-{g}","status":"CANCELLED","providerEventId":"{run}-{g}"}}'
        ).encode()
    return (
        f'{{"matchExternalId":"r-{g}","homeScore":{g % 3},"awayScore":{(g // 3) % 3},'
        f'"status":"FINISHED","providerEventId":"{run}-{g}"}}'
    ).encode()


def requests(count: int, run: str, port: int, t: int) -> list[bytes]:
    """Every webhook as raw HTTP/1.1 bytes, each signed for its own body (signed
    at ``t``: within the webhook's 300 s tolerance for the whole run)."""
    out = []
    for g in range(1, count + 1):
        body = result_body(g, run)
        out.append(
            (
                f"POST {PATH} HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\n"
                f"Content-Type: application/json\r\nX-Signature: {sign_webhook(SECRET, body, t)}"
                f"\r\nContent-Length: {len(body)}\r\n\r\n"
            ).encode()
            + body
        )
    return out


# --- the open-loop load -------------------------------------------------------


@dataclass
class Load:
    due: list[float] = field(default_factory=list)  # wall time each request was due
    done: list[float] = field(default_factory=list)  # wall time of its response (0: none)
    status: list[int] = field(default_factory=list)


async def open_loop(
    port: int, reqs: list[bytes], rate: float, connections: int, grace_s: float
) -> Load:
    """Request i is due at start + i / rate whatever the server does; a free
    connection sends it (the queue grows when all are busy, and that wait counts in
    its latency). Requests still queued ``grace_s`` after the last one was due are
    not sent (status 0: the server fell that far behind). One small client: raw
    asyncio streams, prebuilt bytes."""
    n = len(reqs)
    load = Load([0.0] * n, [0.0] * n, [0] * n)
    queue: asyncio.Queue[int] = asyncio.Queue()
    start = time.time() + 0.2

    async def schedule() -> None:
        for i in range(n):
            due = start + i / rate
            load.due[i] = due
            delay = due - time.time()
            if delay > 0.002:
                await asyncio.sleep(delay)
            queue.put_nowait(i)

    async def connection() -> None:
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        try:
            while True:
                i = await queue.get()
                queue.task_done()  # taken: join() waits for the queue to be emptied
                if i < 0:
                    return
                writer.write(reqs[i])
                head = await reader.readuntil(b"\r\n\r\n")
                status = int(head[9:12])
                length = 0
                for line in head.split(b"\r\n"):
                    if line[:15].lower() == b"content-length:":
                        length = int(line[15:])
                await reader.readexactly(length)
                load.done[i], load.status[i] = time.time(), status
        finally:
            writer.close()

    clients = [asyncio.create_task(connection()) for _ in range(connections)]
    await schedule()
    deadline = start + n / rate + grace_s
    with contextlib.suppress(TimeoutError):
        await asyncio.wait_for(queue.join(), max(0.0, deadline - time.time()))
    while not queue.empty():
        queue.get_nowait()
        queue.task_done()
    for _ in clients:
        queue.put_nowait(-1)
    results = await asyncio.gather(*clients, return_exceptions=True)
    errors = [r for r in results if isinstance(r, BaseException)]
    if errors:
        print(f"  {len(errors)} client connections failed: {errors[0]!r}", flush=True)
    return load


# --- CPU of the PostgreSQL backends of the bench database -----------------------


class BackendCpu:
    """Samples (every 0.5 s, in a thread) the CPU seconds of the PostgreSQL
    backends whose command line names the bench database; a backend that exits
    keeps its last reading."""

    def __init__(self, db: str) -> None:
        self.db, self.seen, self.base = db, {}, {}  # type: ignore[var-annotated]
        self.procs: dict[int, psutil.Process] = {}
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._run, daemon=True)

    def _scan(self) -> None:
        for p in psutil.process_iter(["cmdline"]):
            cmd = " ".join(p.info["cmdline"] or ())
            if cmd.startswith("postgres:") and f" {self.db} " in cmd and p.pid not in self.procs:
                self.procs[p.pid] = p
        for pid, p in list(self.procs.items()):
            with contextlib.suppress(psutil.Error):
                t = p.cpu_times()
                self.seen[pid] = t.user + t.system
                self.base.setdefault(pid, self.seen[pid] if self.started else 0.0)

    def _run(self) -> None:
        while not self.stop.wait(0.5):
            self._scan()

    def __enter__(self) -> BackendCpu:
        self.started = False
        self._scan()  # the pools' idle backends: what they spent before is not counted
        self.started = True
        self.thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop.set()
        self.thread.join()
        self._scan()

    def seconds(self) -> float:
        return sum(v - self.base.get(k, 0.0) for k, v in self.seen.items())


def own_cpu(rv: Reservo) -> tuple[float, float]:
    """CPU seconds so far of the API processes (the supervisor and its workers; all
    of `reservo up`) and of the `reservo worker`."""
    worker = None if rv.worker is None else rv.worker.pid
    api = worker_s = 0.0
    for p in rv.own_processes():
        with contextlib.suppress(psutil.Error):
            t = p.cpu_times()
            spent = t.user + t.system + t.children_user + t.children_system
            if p.pid == worker:
                worker_s += spent
            else:
                api += spent
    return api, worker_s


# --- figures ------------------------------------------------------------------


async def drain(conn: asyncpg.Connection, timeout_s: float) -> tuple[float, int]:
    """Wait until every match that got a 202 is SETTLED and no settled-bet
    notification or payout event is pending; returns the seconds waited and the
    matches still unsettled (0 unless the timeout came first: the figures are
    then those of the settled ones)."""
    t = time.perf_counter()
    last = -1
    while time.perf_counter() - t < timeout_s:
        left = await conn.fetchval(
            """SELECT count(*) FROM bench_sent s JOIN betting_match m ON m.external_id = s.ext
                WHERE s.status = 202 AND m.settlement_status <> 'SETTLED'"""
        )
        pending = await conn.fetchval(
            "SELECT count(*) FROM outbox WHERE status = 'PENDING' AND topic = ANY($1)",
            [SETTLED_TOPIC, PAYOUT_TOPIC],
        )
        if left == 0 and pending == 0:
            return time.perf_counter() - t, 0
        if left != last:
            print(f"  draining: {left:,} matches unsettled, {pending:,} events pending", flush=True)
            last = left
        await asyncio.sleep(2)
    return time.perf_counter() - t, left


LAG_SQL = """
WITH settled AS (
    SELECT s.sent_at, extract(epoch FROM m.settled_at - s.acked_at)::float8 AS lag
      FROM bench_sent s JOIN betting_match m ON m.external_id = s.ext
     WHERE s.status = 202 AND m.settled_at IS NOT NULL),
paid AS (
    -- a winning (or void) bet is paid once its last leg's result is in: lag from the
    -- latest 202 of its matches to its credit
    SELECT max(s.sent_at) AS sent_at,
           extract(epoch FROM min(t.created_at) - max(s.acked_at))::float8 AS lag
      FROM wallet_transfer t
      JOIN betting_selection l ON t.reference = 'bet:' || l.bet_id
      JOIN betting_match m ON m.id = l.match_id
      JOIN bench_sent s ON s.ext = m.external_id
     WHERE t.kind IN ('PAYOUT', 'REFUND')
     GROUP BY l.bet_id),
notified AS (
    SELECT s.sent_at, extract(epoch FROM max(o.published_at) - s.acked_at)::float8 AS lag
      FROM outbox o JOIN bench_sent s ON o.key = 'match:' || s.ext
     WHERE o.topic = $1 AND o.status = 'DONE'
     GROUP BY s.ext, s.sent_at, s.acked_at)
SELECT what, bucket, count(*) AS n,
       percentile_cont(0.5) WITHIN GROUP (ORDER BY lag) AS p50,
       percentile_cont(0.99) WITHIN GROUP (ORDER BY lag) AS p99,
       max(lag) AS max
  FROM (SELECT 'settled' AS what, floor(sent_at / 10) AS b, lag FROM settled
        UNION ALL SELECT 'paid', floor(sent_at / 10), lag FROM paid
        UNION ALL SELECT 'notified', floor(sent_at / 10), lag FROM notified) x,
       LATERAL (SELECT b::int * 10 AS bucket) y
 GROUP BY GROUPING SETS ((what), (what, bucket))
 ORDER BY what, bucket NULLS FIRST
"""


async def invariants(conn: asyncpg.Connection, accepted: int, drained: bool) -> list[str]:
    problems = []
    twice = await conn.fetchval(
        """SELECT count(*) FROM (SELECT reference FROM wallet_transfer
            WHERE kind IN ('PAYOUT', 'REFUND') GROUP BY reference HAVING count(*) > 1) x"""
    )
    unpaid = await conn.fetchval(
        """SELECT count(*) FROM betting_bet b WHERE b.status IN ('WON', 'VOID') AND b.payout > 0
              AND NOT EXISTS (SELECT 1 FROM wallet_transfer t WHERE t.kind IN ('PAYOUT', 'REFUND')
                                 AND t.reference = 'bet:' || b.id)"""
    )
    paid_wrong = await conn.fetchval(
        """SELECT count(*) FROM wallet_transfer t JOIN betting_bet b ON t.reference = 'bet:' || b.id
            WHERE t.kind IN ('PAYOUT', 'REFUND') AND (t.amount <> b.payout OR b.status = 'LOST')"""
    )
    ledger = await conn.fetchrow(
        """SELECT sum(balance) AS total,
                  count(*) FILTER (WHERE balance <> coalesce(e.sum, 0)) AS off
             FROM wallet_account a
             LEFT JOIN (SELECT account_id, sum(amount) FROM wallet_entry GROUP BY 1) e
               ON e.account_id = a.id"""
    )
    inbox = await conn.fetchval(
        """SELECT count(*) FROM bench_sent s JOIN betting_result_inbox i
                ON i.provider_event_id = s.pid WHERE s.status = 202 AND i.outcome = 'APPLIED'"""
    )
    left = await conn.fetchval(
        """SELECT count(*) FROM betting_selection l JOIN betting_match m ON m.id = l.match_id
            WHERE m.settlement_status = 'SETTLED' AND l.status = 'PENDING'"""
    )
    fallback = await conn.fetchval(
        "SELECT count(*) FROM webhook_events_fallback WHERE status = 'FAILED'"
    )
    if twice:
        problems.append(f"{twice} bets paid more than once")
    if unpaid:
        problems.append(f"{unpaid} winning/void bets not paid")
    if paid_wrong:
        problems.append(f"{paid_wrong} credits not the bet's payout")
    if ledger["total"] != 0 or ledger["off"]:
        problems.append(f"ledger: balances sum to {ledger['total']}, {ledger['off']} off")
    if inbox != accepted and drained:
        problems.append(f"{inbox} results APPLIED in the inbox for {accepted} accepted")
    if left:
        problems.append(f"{left} legs of settled matches still pending")
    if fallback:
        problems.append(f"{fallback} fallback rows FAILED")
    return problems


# --- main ---------------------------------------------------------------------


def environment(args: argparse.Namespace, url: str, name: str) -> dict[str, str]:
    env = {
        "RESERVO_DATABASE_URL": url,
        "RESERVO_REDIS_NAMESPACE": name,
        "RESERVO_LOG_LEVEL": "WARNING",
        "RESERVO_BETTING_RESEND_INTERVAL_S": str(args.resend_interval),
        "RESERVO_OUTBOX_POLL_INTERVAL_S": "0.05",
    }
    if args.resend_batch:
        env["RESERVO_BETTING_RESEND_BATCH"] = str(args.resend_batch)
    return env


async def run(args: argparse.Namespace) -> int:
    run_id = f"b{uuid.uuid4().hex[:6]}"
    name = f"reservo_bench_intake_{run_id}"
    admin = await asyncpg.connect(args.pg)
    await admin.execute(f'CREATE DATABASE "{name}"')
    await admin.close()
    url = f"{args.pg.rpartition('/')[0]}/{name}"
    broker = None
    try:
        await migrate(url)
        await seed(url, args.matches, args.singles, args.accounts)
        count = min(args.matches, round(args.rate * args.duration))
        extra = environment(args, url, name)
        server = "up" if args.mode == "up" else "uvicorn"
        if args.mode == "deploy-kafka":
            import tempfile

            from reservo.core.embedded import EmbeddedKafka

            broker = EmbeddedKafka(Path(tempfile.mkdtemp(prefix="reservo-bench-kafka-")))
            extra["RESERVO_KAFKA_BOOTSTRAP"] = broker.start()
            extra["RESERVO_KAFKA_IDEMPOTENCE"] = "false"  # Tansu's in-memory store
        # The worker's roles as OPERATIONS lists them for the sportsbook (with Kafka
        # also the consumer groups of the results and of the payouts).
        roles = "relay,results_resend,settlement,maintenance"
        if args.mode == "deploy-kafka":
            roles += ",betting.settlement,wallet.payouts,notifications"
        with Reservo(args.workers, extra, server, roles) as rv:
            reqs = requests(count, run_id, rv.port, int(time.time() + args.duration / 2))
            conn = await asyncpg.connect(url)
            cpu0, load0 = own_cpu(rv), os.getloadavg()
            with BackendCpu(name) as pg:
                t0 = time.time()
                load = await open_loop(rv.port, reqs, args.rate, args.connections, args.grace)
                t_sent = time.time()
                buf = io.BytesIO()
                for g in range(1, count + 1):
                    i = g - 1
                    buf.write(
                        f"r-{g}\t{run_id}-{g}\t{load.due[i] - t0:.6f}\t"
                        f"{load.done[i] or load.due[i]:.6f}\t{load.status[i]}\n".encode()
                    )
                await conn.execute(
                    """CREATE TABLE bench_sent (ext text PRIMARY KEY, pid text, sent_at float8,
                                                acked_epoch float8, status int,
                                                acked_at timestamptz GENERATED ALWAYS AS
                                                (to_timestamp(acked_epoch)) STORED)"""
                )
                buf.seek(0)
                await conn.copy_to_table(
                    "bench_sent",
                    source=buf,
                    columns=["ext", "pid", "sent_at", "acked_epoch", "status"],
                )
                accepted = sum(1 for s in load.status if s == 202)
                drained, unsettled = await drain(conn, args.drain_timeout)
                t_end = time.time()
            cpu1, load1 = own_cpu(rv), os.getloadavg()
            errors = rv.error_lines()
        lat = sorted(d - u for d, u, s in zip(load.done, load.due, load.status, strict=True) if s)
        statuses: dict[int, int] = {}
        for s in load.status:
            statuses[s] = statuses.get(s, 0) + 1
        acked = [d for d in load.done if d]
        span = (max(acked) - t0) if acked else 0.0
        lags = await conn.fetch(LAG_SQL, SETTLED_TOPIC)
        settled = await conn.fetchrow(
            """SELECT count(*) AS n, extract(epoch FROM max(settled_at))::float8 AS last,
                      extract(epoch FROM min(settled_at))::float8 AS first
                 FROM betting_bet WHERE status <> 'PENDING'"""
        )
        per_10s = await conn.fetch(
            """SELECT floor(extract(epoch FROM settled_at) - $1)::int / 10 * 10 AS b, count(*)
                 FROM betting_bet WHERE status <> 'PENDING' GROUP BY 1 ORDER BY 1""",
            t0,
        )
        problems = await invariants(conn, accepted, unsettled == 0)
        matches_done = await conn.fetchrow(
            """SELECT count(*) AS n, extract(epoch FROM max(m.settled_at))::float8 AS last
                 FROM bench_sent s JOIN betting_match m ON m.external_id = s.ext
                WHERE m.settlement_status = 'SETTLED'"""
        )
        await conn.close()
        q = (lambda p: lat[min(len(lat) - 1, int(p * len(lat)))] * 1000) if lat else (lambda p: 0)
        bets_span = (settled["last"] - t0) if settled["n"] else 0.0
        pg_s = pg.seconds()
        print(f"\n== results intake, mode {args.mode} ({machine()})")
        print(
            f"  load: {count:,} results due at {args.rate:,.0f}/s over {args.duration:.0f} s,"
            f" {args.connections} connections; {args.matches:,} matches,"
            f" {args.singles} singles + 1 accumulator (3 legs) each"
        )
        print(
            f"  intake: statuses {statuses} (0: not sent, {args.grace:.0f} s behind),"
            f" {accepted:,} accepted in {span:.1f} s ="
            f" {accepted / span if span else 0:,.0f} results/s sustained;"
            f" latency from due time p50 {q(0.5):.0f} ms, p99 {q(0.99):.0f} ms,"
            f" max {q(1.0):.0f} ms"
        )
        if unsettled:
            print(
                f"  NOT DRAINED: {unsettled:,} matches still unsettled {drained:.0f} s after"
                f" the last send ({t_sent - t0:.1f} s of sending); figures below are the"
                " settled ones'"
            )
        else:
            print(
                f"  drained {drained:.1f} s after the last send ({t_sent - t0:.1f} s of sending);"
                f" all settled, paid and notified {t_end - t0:.1f} s after the first"
            )
        done_s = (matches_done["last"] - t0) if matches_done["n"] else 0.0
        print(
            f"  matches settled: {matches_done['n']:,} in {done_s:.1f} s ="
            f" {matches_done['n'] / done_s if done_s else 0:,.0f} matches/s"
        )
        print(
            f"  bets settled: {settled['n']:,} in {bets_span:.1f} s ="
            f" {settled['n'] / bets_span * 60 if bets_span else 0:,.0f} bets/min;"
            " per 10 s: " + ", ".join(f"{r['b']}s:{r['count']:,}" for r in per_10s)
        )
        for r in lags:
            if r["bucket"] is None:
                print(
                    f"  lag 202 -> {r['what']:8s} n={r['n']:,} p50 {r['p50']:.2f} s,"
                    f" p99 {r['p99']:.2f} s, max {r['max']:.2f} s"
                )
        for what in ("settled", "paid", "notified"):
            rows = [r for r in lags if r["what"] == what and r["bucket"] is not None]
            print(
                f"  {what} lag p50/max by 10 s of arrival: "
                + ", ".join(f"{r['bucket']}s:{r['p50']:.1f}/{r['max']:.1f}" for r in rows)
            )
        api_s, worker_s = cpu1[0] - cpu0[0], cpu1[1] - cpu0[1]
        per = 1e6 / max(accepted, 1)
        print(
            f"  CPU: postgres backends {pg_s:.1f} s = {pg_s * per:,.0f} us per result;"
            f" reservo {api_s + worker_s:.1f} s = {(api_s + worker_s) * per:,.0f} us per result"
            f" (API {api_s * per:,.0f} us, worker {worker_s * per:,.0f} us)"
        )
        print(f"  load average {load0[0]:.1f} at the start, {load1[0]:.1f} at the end")
        print(f"  invariants: {'all hold' if not problems else '; '.join(problems)}")
        if errors:
            print(f"  {len(errors)} error lines in the logs, first: {errors[0][:300]}")
        server_errors = sum(n for status, n in statuses.items() if status >= 500)
        if server_errors:
            print(f"  {server_errors:,} webhooks answered 5xx (the provider never resends)")
        return 1 if problems or server_errors else 0
    finally:
        if broker is not None:
            broker.stop()
        if not args.keep:
            admin = await asyncpg.connect(args.pg)
            await admin.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
            await admin.close()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--pg", default="postgresql://postgres@127.0.0.1:5432/postgres")
    ap.add_argument("--mode", choices=("up", "deploy", "deploy-kafka"), default="up")
    ap.add_argument("--workers", type=int, default=2, help="API processes (deploy modes)")
    ap.add_argument("--matches", type=int, default=500_000)
    ap.add_argument("--singles", type=int, default=2, help="single bets per match")
    ap.add_argument("--accounts", type=int, default=20_000)
    ap.add_argument("--rate", type=float, default=8_333.0, help="results per second")
    ap.add_argument("--duration", type=float, default=60.0, help="seconds of sending")
    ap.add_argument("--connections", type=int, default=256)
    ap.add_argument(
        "--grace", type=float, default=10.0, help="s after the last due time before giving up"
    )
    ap.add_argument("--resend-interval", type=float, default=0.5)
    ap.add_argument("--resend-batch", type=int, default=0, help="0: the setting's default")
    ap.add_argument("--drain-timeout", type=float, default=900.0)
    ap.add_argument("--keep", action="store_true", help="keep the database")
    sys.exit(asyncio.run(run(ap.parse_args())))


if __name__ == "__main__":
    main()
