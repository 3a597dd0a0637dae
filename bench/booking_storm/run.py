"""Booking storm: the peak of the design note, on real processes.

2,000 doctors x 40 slots x 14 days (1.12 M slots) are loaded by SQL; the agenda
of the last day "opens" and wrk drives booking attempts at 30 hot slots (half with
capacity 1, half with capacity 10) from 20,000 patients, each request with its own
patient JWT and a fresh Idempotency-Key. Afterwards PostgreSQL is asked whether any
slot is overbooked or out of step with its appointments.

    python bench/booking_storm/run.py --duration 30
    python bench/booking_storm/run.py --duration 10 --workers 1,2,3 --connections 64,128,256
    python bench/booking_storm/run.py --duration 10 --tracing off,on  # CPU per attempt
    python bench/booking_storm/run.py --duration 10 --runs 3 --server uvicorn,granian,up
    python bench/booking_storm/run.py --workers 1 --threads 1 --connections 32 \
        --warmup 15 --duration 20 --ceiling-duration 0 --callgrind /tmp/cg-storm

``--server``: uvicorn (`reservo api`, the default), granian (the same app under
granian), up (`reservo up`, one process); several are interleaved run by run and
put side by side at the end. The hello ceiling is uvicorn's in every case.

``--tracing on`` runs the API and the worker with OpenTelemetry spans on (the
standard OTEL_* variables: an OTLP/HTTP endpoint, a parent-based trace-id ratio
sampler at ``--sampling``, 1 % by default), exporting to a local sink that reads
and discards what it is sent; ``off`` is the default (ids only, no exporter).

``--callgrind PREFIX`` (one API process) counts the API's instructions per
attempt (bench/README.md); the hot slots are booked full first, so every counted
attempt is a refusal.

Exits 1 on any 5xx, overbooking or counter mismatch.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import http.server
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
import benchlib

HERE = Path(__file__).resolve().parent
HOT_SLOTS = 30
HOT_CAPACITIES = (1, 10)
WARM_CAPACITY = 1000  # warm-up slots never fill, so warm-up exercises the whole write path


@dataclass
class RunResult:
    workers: int
    threads: int
    connections: int
    attempts_per_s: float
    requests: int
    statuses: dict[str, int]
    p50_ms: float
    p90_ms: float
    p99_ms: float
    max_ms: float
    socket_errors: dict[str, int]
    peak_rss_mb: float
    peak_pss_mb: float
    peak_rss_by_process_mb: dict[str, float]
    booked_hot: int
    hot_capacity: int
    created_201: int
    overbooked_slots: int
    mismatched_slots: int
    outbox_events: int
    appointments_total: int
    outbox_pending_after_10s: int
    errors_logged: int
    cpu: dict[str, float]
    tracing: str = "off"
    server: str = "uvicorn"

    @property
    def failures(self) -> list[str]:
        bad = []
        n5xx = sum(n for k, n in self.statuses.items() if k.startswith("5"))
        if n5xx:
            bad.append(f"{n5xx} responses were 5xx")
        if self.overbooked_slots:
            bad.append(f"{self.overbooked_slots} slots overbooked")
        if self.mismatched_slots:
            bad.append(f"{self.mismatched_slots} slots whose booked_count != BOOKED rows")
        if self.booked_hot < self.created_201:
            bad.append(f"{self.created_201} answered 201 but only {self.booked_hot} bookings exist")
        if self.booked_hot > self.hot_capacity:
            bad.append(f"{self.booked_hot} bookings on hot slots of capacity {self.hot_capacity}")
        if self.outbox_events != self.appointments_total:
            bad.append(f"{self.appointments_total} bookings but {self.outbox_events} outbox events")
        return bad


# Slots at 09:00 local on a given day, one per doctor: a burst on one time of day,
# as when a clinic publishes tomorrow's best hour.
_HOT = """
SELECT s.id FROM time_slot s JOIN doctor d ON d.id = s.doctor_id
 WHERE d.id BETWEEN $1 AND $2
   AND s.start_at = (($3::date + time '09:00') AT TIME ZONE d.timezone)
 ORDER BY d.id
"""
_WARM = """
SELECT s.id FROM time_slot s
 WHERE s.doctor_id = $1 AND s.start_at >= $2::date - interval '1 day'
 ORDER BY s.start_at LIMIT $3
"""
_OVERBOOKED = "SELECT count(*) FROM time_slot WHERE booked_count > capacity"
# Every slot with a booking, or with a counter above zero, must agree with its rows.
_MISMATCHED = """
WITH a AS (SELECT slot_id, count(*) AS n FROM appointment WHERE status = 'BOOKED'
            GROUP BY slot_id)
SELECT count(*) FROM time_slot s FULL JOIN a ON a.slot_id = s.id
 WHERE (s.booked_count > 0 OR a.n IS NOT NULL)
   AND coalesce(s.booked_count, -1) <> coalesce(a.n, 0)
"""


async def prepare_slots(ds: benchlib.Dataset) -> tuple[list[int], int, list[int]]:
    conn = await benchlib.connect()
    try:
        await benchlib.reset_state(conn)
        hot = [r["id"] for r in await conn.fetch(_HOT, 1, HOT_SLOTS, ds.last_day)]
        if len(hot) != HOT_SLOTS:
            raise RuntimeError(f"found {len(hot)} hot slots, wanted {HOT_SLOTS}")
        caps = [HOT_CAPACITIES[i % len(HOT_CAPACITIES)] for i in range(len(hot))]
        await conn.executemany(
            "UPDATE time_slot SET capacity = $2 WHERE id = $1", list(zip(hot, caps, strict=True))
        )
        warm = [r["id"] for r in await conn.fetch(_WARM, HOT_SLOTS + 1, ds.last_day, 30)]
        await conn.execute(
            "UPDATE time_slot SET capacity = $2 WHERE id = ANY($1::bigint[])", warm, WARM_CAPACITY
        )
        return hot, sum(caps), warm
    finally:
        await conn.close()


async def check(hot: list[int]) -> dict[str, int]:
    conn = await benchlib.connect()
    try:
        pending = -1
        for _ in range(50):  # the relay should drain the outbox within seconds
            pending = await conn.fetchval("SELECT count(*) FROM outbox WHERE status <> 'DONE'")
            if pending == 0:
                break
            await asyncio.sleep(0.2)
        return {
            "booked_hot": await conn.fetchval(
                "SELECT count(*) FROM appointment WHERE status = 'BOOKED' AND slot_id = ANY($1)",
                hot,
            ),
            "overbooked_slots": await conn.fetchval(_OVERBOOKED),
            "mismatched_slots": await conn.fetchval(_MISMATCHED),
            "outbox_events": await conn.fetchval(
                "SELECT count(*) FROM outbox WHERE topic = 'appointments.appointment.booked.v1'"
            ),
            "appointments_total": await conn.fetchval("SELECT count(*) FROM appointment"),
            "outbox_pending_after_10s": pending,
        }
    finally:
        await conn.close()


def fill_hot_slots(hot: list[int], capacity: int, url: str, patients: Path) -> None:
    """Books the hot slots full before a run counted under callgrind: at its pace
    (some 50 attempts/s) the seats' bookings would be a share of the counted
    attempts that changes with the machine's speed; full, every counted attempt
    is the storm's refusal."""

    async def booked() -> int:
        conn = await benchlib.connect()
        try:
            n: int = await conn.fetchval(
                "SELECT coalesce(sum(booked_count), 0) FROM time_slot WHERE id = ANY($1)", hot
            )
            return n
        finally:
            await conn.close()

    deadline = time.monotonic() + 300
    while benchlib.run_async(booked()) < capacity:
        if time.monotonic() > deadline:
            raise RuntimeError("the hot slots did not fill in 300 s")
        args = [str(patients), ",".join(map(str, hot)), f"fill{time.time_ns()}"]
        benchlib.run_wrk(HERE / "storm.lua", url, 1, 8, 3, args)


def one_run(
    ds: benchlib.Dataset,
    opts: argparse.Namespace,
    workers: int,
    threads: int,
    connections: int,
    files: dict[str, Path],
    profile_out: Path | None,
    tracing: str = "off",
    sink: str | None = None,
    server: str = "uvicorn",
) -> RunResult:
    hot, hot_capacity, warm = benchlib.run_async(prepare_slots(ds))
    env = {"RESERVO_DB_POOL_MAX": str(opts.pool_max)} if opts.pool_max else {}
    if tracing == "on":
        assert sink is not None
        env.update(
            {
                "OTEL_EXPORTER_OTLP_ENDPOINT": sink,
                "OTEL_TRACES_SAMPLER": "parentbased_traceidratio",
                "OTEL_TRACES_SAMPLER_ARG": str(opts.sampling),
            }
        )
    with benchlib.Reservo(workers, env, server, callgrind=opts.callgrind) as rv:
        url = rv.base
        if opts.warmup > 0:
            benchlib.run_wrk(
                HERE / "storm.lua",
                url,
                threads,
                connections,
                opts.warmup,
                [str(files["warm"]), ",".join(map(str, warm)), f"warm{time.time_ns()}"],
            )
            time.sleep(1.0)
        args = [str(files["storm"]), ",".join(map(str, hot)), f"storm{time.time_ns()}"]
        if opts.callgrind is not None:
            fill_hot_slots(hot, hot_capacity, url, files["warm"])
        with (
            benchlib.RssSampler(rv) as mem,
            benchlib.CpuMeter(rv) as cpu,
            benchlib.watched(rv, opts, profile_out) as instructions,
        ):
            res = benchlib.run_wrk(
                HERE / "storm.lua", url, threads, connections, opts.duration, args
            )
        facts = benchlib.run_async(check(hot))
        errors = rv.error_lines()
        for line in errors[:5]:
            print(f"  logged: {line[:200]}", file=sys.stderr)
    mb = 1024 * 1024
    return RunResult(
        workers=rv.workers,
        threads=threads,
        connections=connections,
        attempts_per_s=res.rate,
        requests=res.requests,
        statuses=dict(sorted(res.statuses.items())),
        p50_ms=res.p50_ms,
        p90_ms=res.p90_ms,
        p99_ms=res.p99_ms,
        max_ms=res.max_ms,
        socket_errors=res.socket_errors,
        peak_rss_mb=mem.peak_rss / mb,
        peak_pss_mb=mem.peak_pss / mb,
        peak_rss_by_process_mb={k: round(v / mb, 1) for k, v in mem.peak_by_proc.items()},
        hot_capacity=hot_capacity,
        created_201=res.count("201"),
        errors_logged=len(errors),
        cpu=cpu.figures(res.requests, res.wrk_cpu_s) | instructions.figures(res.requests),
        tracing=tracing,
        server=server,
        **facts,
    )


class _Discard(http.server.BaseHTTPRequestHandler):
    """An OTLP/HTTP endpoint that reads every export and keeps nothing."""

    def do_POST(self) -> None:
        self.rfile.read(int(self.headers.get("Content-Length") or 0))
        self.send_response(200)
        self.send_header("Content-Type", "application/x-protobuf")
        self.send_header("Content-Length", "0")
        self.end_headers()

    def log_message(self, format: str, *args: object) -> None:
        return None


@contextlib.contextmanager
def otlp_sink() -> Iterator[str]:
    """A local OTLP/HTTP endpoint (its base URL) that discards what it gets."""
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Discard)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()


def describe(r: RunResult) -> str:
    total = max(1, r.requests)
    split = ", ".join(f"{k}: {n} ({100 * n / total:.1f}%)" for k, n in r.statuses.items())
    errs = f"  socket errors {r.socket_errors}" if r.socket_errors else ""
    return (
        f"{r.server}, tracing {r.tracing}, workers={r.workers} "
        f"wrk -t{r.threads} -c{r.connections}: "
        f"{r.attempts_per_s:,.0f} attempts/s ({r.requests:,} in total), "
        f"p50 {r.p50_ms:.1f} ms, p99 {r.p99_ms:.1f} ms, max {r.max_ms:.0f} ms{errs}\n"
        f"  statuses: {split}\n"
        f"  hot slots: {r.booked_hot}/{r.hot_capacity} seats booked, 201s {r.created_201}; "
        f"overbooked {r.overbooked_slots}, mismatched {r.mismatched_slots}; "
        f"outbox {r.outbox_events} events / {r.appointments_total} bookings "
        f"(pending after drain: {r.outbox_pending_after_10s})\n"
        f"  peak memory of reservo processes: RSS {r.peak_rss_mb:.0f} MB, "
        f"PSS {r.peak_pss_mb:.0f} MB  {r.peak_rss_by_process_mb}\n"
        f"  {benchlib.describe_cpu(r.cpu)}"
    )


def tracing_table(
    configs: list[tuple[int, int, int]], results: list[RunResult], sampling: float
) -> None:
    """reservo's CPU per attempt with tracing off and on, side by side (medians)."""
    print(f"\nreservo CPU per attempt, tracing off and on ({100 * sampling:g} % sampled):")
    print("workers  wrk          off ms/req  on ms/req  on/off")
    for w, t, c in configs:
        cpu = {
            mode: benchlib.median(
                [
                    r.cpu["cpu_ms_per_req_reservo"]
                    for r in results
                    if (r.workers, r.threads, r.connections, r.tracing) == (w, t, c, mode)
                ]
            )
            for mode in ("off", "on")
        }
        print(
            f"{w:>7}  -t{t} -c{c:<4}  {cpu['off']:>10.3f}  {cpu['on']:>9.3f}"
            f"  {100 * (cpu['on'] / max(cpu['off'], 1e-9) - 1):+6.1f} %"
        )


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--duration", type=float, default=30, help="seconds of storm per run")
    p.add_argument("--workers", default="2", help="API worker counts to compare, e.g. 1,2,3")
    p.add_argument("--threads", default="2", help="wrk threads to compare, e.g. 1,2")
    p.add_argument("--connections", default="128", help="wrk connections, e.g. 64,128,256")
    p.add_argument("--runs", type=int, default=1, help="runs per configuration (median)")
    p.add_argument(
        "--server", default="uvicorn", help="uvicorn, granian, up, or several: uvicorn,granian,up"
    )
    p.add_argument("--patients", type=int, default=20_000)
    p.add_argument("--warmup", type=float, default=3, help="seconds of warm-up bookings")
    benchlib.add_profile_options(p)
    # 10 per process: enough for 2 cores, and 3 API processes + the worker at the
    # default 20 would crowd a shared server's max_connections = 100.
    p.add_argument("--pool-max", type=int, default=10, help="RESERVO_DB_POOL_MAX (0: default)")
    p.add_argument("--doctors", type=int, default=2000)
    p.add_argument("--days", type=int, default=14)
    p.add_argument("--fresh", action="store_true", help="reload the slots even if present")
    benchlib.add_ceiling_option(p)
    p.add_argument(
        "--tracing",
        default="off",
        help="off, on, or off,on: OpenTelemetry spans exported to a local sink (on) or not",
    )
    p.add_argument("--sampling", type=float, default=0.01, help="trace ratio when tracing is on")
    p.add_argument("--json", type=Path, help="append every run's figures to this file")
    p.add_argument("--drop-db", action="store_true", help="drop the database at the end")
    opts = p.parse_args(argv)
    servers = benchlib.parse_servers(opts.server)
    benchlib.stop_cleanly_on_signals()

    print(f"machine: {benchlib.machine()}")
    print(f"reservo code under test: {benchlib.reservo_source()}")
    started = time.perf_counter()
    ds = benchlib.run_async(benchlib.ensure_dataset(opts.doctors, opts.days, 40, opts.fresh))
    how = f"loaded in {ds.loaded_in_s:.1f} s" if ds.loaded_in_s else "reused"
    print(
        f"data set: {ds.doctors} doctors x {ds.per_day} slots x {ds.days} days = "
        f"{ds.slots:,} slots ({how}); agenda opening {ds.last_day}"
    )
    tmp = Path(tempfile.mkdtemp(prefix="reservo-storm-"))
    files = {
        "storm": benchlib.mint_patients(tmp / "patients.txt", 1_000_000, opts.patients),
        "warm": benchlib.mint_patients(tmp / "warm.txt", 2_000_000, opts.patients),
    }
    print(f"minted {2 * opts.patients:,} patient tokens in {time.perf_counter() - started:.1f} s")

    modes = [m.strip() for m in opts.tracing.split(",") if m.strip()]
    if not modes or set(modes) - {"off", "on"}:
        p.error("--tracing takes off, on or off,on")
    results: list[RunResult] = []
    ceilings: list[benchlib.Ceiling | None] = []
    with otlp_sink() as sink:
        for mode in modes:
            configs, got, ceiling = benchlib.sweep(
                opts,
                "booking_storm",
                lambda w, t, c, prof, server, mode=mode: one_run(
                    ds, opts, w, t, c, files, prof, mode, sink, server
                ),
                describe,
                lambda r: r.attempts_per_s,
                servers,
            )
            results += got
            ceilings += ceiling
    if len(modes) > 1:
        tracing_table(configs, results, opts.sampling)

    print(f"\nmedians over {opts.runs} run(s) of {opts.duration:.0f} s:")
    print(
        "server   tracing  workers  wrk        attempts/s  p50 ms  p99 ms  201  409%   429%  5xx"
        "  RSS MB"
        "  reservo CPU ms/req  est. alone/s"
    )
    for server, w, t, c, mode in dict.fromkeys(
        (r.server, r.workers, r.threads, r.connections, r.tracing) for r in results
    ):
        rs = [
            r
            for r in results
            if (r.server, r.workers, r.threads, r.connections, r.tracing) == (server, w, t, c, mode)
        ]
        med = benchlib.median
        pct = [
            med([100 * r.statuses.get(k, 0) / max(1, r.requests) for r in rs])
            for k in ("409 slot_full", "429 rate_limited")
        ]
        n5xx = sum(n for r in rs for k, n in r.statuses.items() if k.startswith("5"))
        print(
            f"{server:<8} {mode:<7}  {w:>7}  -t{t} -c{c:<4} "
            f"{med([r.attempts_per_s for r in rs]):>9,.0f}  "
            f"{med([r.p50_ms for r in rs]):>6.1f}  {med([r.p99_ms for r in rs]):>6.1f}  "
            f"{med([r.created_201 for r in rs]):>3.0f}  {pct[0]:>5.1f}  {pct[1]:>5.1f}  "
            f"{n5xx:>3}  {med([r.peak_rss_mb for r in rs]):>6.0f}"
            f"  {med([r.cpu['cpu_ms_per_req_reservo'] for r in rs]):>18.2f}"
            f"  {med([r.cpu['rate_if_machine_were_ours'] for r in rs]):>12,.0f}"
        )

    benchlib.ceiling_summary(configs, results, ceilings, lambda r: r.attempts_per_s, "attempts/s")
    if len(servers) > 1:
        benchlib.server_summary(results, ceilings, lambda r: r.attempts_per_s, "attempts/s")

    failures = [f"{r.workers}w/-c{r.connections}: {f}" for r in results for f in r.failures]
    return benchlib.finish(
        failures, opts.drop_db, "zero 5xx, zero overbooking, every booking has its outbox event"
    )


if __name__ == "__main__":
    sys.exit(main())
