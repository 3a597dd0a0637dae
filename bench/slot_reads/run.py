"""Slot reads: GET /api/doctors/{id}/slots?date=... for a random doctor and date
over the 1.12 M slots (2,000 doctors x 40 slots x 14 days), as random patients.

Uniformly random (doctor, date) pairs are the cache's worst case: 28,000 keys, so
in a 10 s run most reads are a list's first read and go to PostgreSQL (a longer
run finds more lists cached: compare runs of the same duration only).

    python bench/slot_reads/run.py --duration 30
    python bench/slot_reads/run.py --duration 10 --workers 1,2,3 --connections 64,128,256
    python bench/slot_reads/run.py --duration 30 --mix skewed   # realistic popularity
    python bench/slot_reads/run.py --duration 10 --runs 3 --server uvicorn,granian,up

``--server``: uvicorn (`reservo api`, the default), granian (the same app under
granian), up (`reservo up`, one process); several are interleaved run by run and
put side by side at the end. The hello ceiling is uvicorn's in every case.

Exits 1 on any 5xx, socket error, or a read that found no slot.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
import benchlib

HERE = Path(__file__).resolve().parent


@dataclass
class RunResult:
    workers: int
    threads: int
    connections: int
    reads_per_s: float
    requests: int
    statuses: dict[str, int]
    p50_ms: float
    p90_ms: float
    p99_ms: float
    max_ms: float
    socket_errors: dict[str, int]
    peak_rss_mb: float
    cpu: dict[str, float]
    server: str = "uvicorn"

    @property
    def failures(self) -> list[str]:
        bad = [f"{n} x {k}" for k, n in self.statuses.items() if not k.startswith("200")]
        if self.statuses.get("200 empty"):
            bad.append(f"{self.statuses['200 empty']} reads found no slot")
        if self.socket_errors:
            bad.append(f"socket errors {self.socket_errors}")
        return bad


def one_run(
    ds: benchlib.Dataset,
    opts: argparse.Namespace,
    workers: int,
    threads: int,
    connections: int,
    patients: Path,
    profile_out: Path | None,
    server: str = "uvicorn",
) -> RunResult:
    benchlib.clear_redis_namespace()  # every run starts from the same cold cache
    days = [ds.first_day + timedelta(days=i) for i in range(ds.days)]
    args = [str(patients), "1", str(ds.doctors), ",".join(d.isoformat() for d in days), opts.mix]
    env = {"RESERVO_DB_POOL_MAX": str(opts.pool_max)} if opts.pool_max else {}
    script = HERE / "reads.lua"
    with benchlib.Reservo(workers, env, server, callgrind=opts.callgrind) as rv:
        if opts.warmup > 0:
            benchlib.run_wrk(script, rv.base, threads, connections, opts.warmup, args)
        with (
            benchlib.RssSampler(rv) as mem,
            benchlib.CpuMeter(rv) as cpu,
            benchlib.watched(rv, opts, profile_out) as instructions,
        ):
            res = benchlib.run_wrk(script, rv.base, threads, connections, opts.duration, args)
        for line in rv.error_lines()[:5]:
            print(f"  logged: {line[:200]}", file=sys.stderr)
    return RunResult(
        workers=rv.workers,
        threads=threads,
        connections=connections,
        reads_per_s=res.rate,
        requests=res.requests,
        statuses=dict(sorted(res.statuses.items())),
        p50_ms=res.p50_ms,
        p90_ms=res.p90_ms,
        p99_ms=res.p99_ms,
        max_ms=res.max_ms,
        socket_errors=res.socket_errors,
        peak_rss_mb=mem.peak_rss / (1024 * 1024),
        cpu=cpu.figures(res.requests, res.wrk_cpu_s) | instructions.figures(res.requests),
        server=server,
    )


def describe(r: RunResult) -> str:
    errs = f"  socket errors {r.socket_errors}" if r.socket_errors else ""
    return (
        f"{r.server} workers={r.workers} wrk -t{r.threads} -c{r.connections}: "
        f"{r.reads_per_s:,.0f} reads/s ({r.requests:,} in total), p50 {r.p50_ms:.1f} ms, "
        f"p99 {r.p99_ms:.1f} ms, max {r.max_ms:.0f} ms{errs}\n"
        f"  statuses: {r.statuses}; peak RSS of reservo processes {r.peak_rss_mb:.0f} MB\n"
        f"  {benchlib.describe_cpu(r.cpu)}"
    )


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--duration", type=float, default=30, help="seconds per run")
    p.add_argument("--workers", default="2", help="API worker counts to compare, e.g. 1,2,3")
    p.add_argument("--threads", default="2", help="wrk threads to compare, e.g. 1,2")
    p.add_argument("--connections", default="128", help="wrk connections, e.g. 64,128,256")
    p.add_argument("--runs", type=int, default=1, help="runs per configuration (median)")
    p.add_argument(
        "--server", default="uvicorn", help="uvicorn, granian, up, or several: uvicorn,granian,up"
    )
    p.add_argument("--patients", type=int, default=5000, help="distinct patient tokens")
    p.add_argument("--warmup", type=float, default=3, help="seconds of warm-up reads")
    p.add_argument(
        "--mix",
        choices=("uniform", "skewed"),
        default="uniform",
        help="uniform: every doctor-day alike (the cache's worst case); skewed: 80%% of "
        "the reads on the next 3 days of the 10%% most popular doctors",
    )
    benchlib.add_profile_options(p)
    # 10 per process: enough for 2 cores, and 3 API processes + the worker at the
    # default 20 would crowd a shared server's max_connections = 100.
    p.add_argument("--pool-max", type=int, default=10, help="RESERVO_DB_POOL_MAX (0: default)")
    p.add_argument("--doctors", type=int, default=2000)
    p.add_argument("--days", type=int, default=14)
    p.add_argument("--fresh", action="store_true", help="reload the slots even if present")
    benchlib.add_ceiling_option(p)
    p.add_argument("--json", type=Path, help="append every run's figures to this file")
    p.add_argument("--drop-db", action="store_true", help="drop the database at the end")
    opts = p.parse_args(argv)
    servers = benchlib.parse_servers(opts.server)
    benchlib.stop_cleanly_on_signals()

    print(f"machine: {benchlib.machine()}")
    print(f"reservo code under test: {benchlib.reservo_source()}; mix {opts.mix}")
    ds = benchlib.run_async(benchlib.ensure_dataset(opts.doctors, opts.days, 40, opts.fresh))
    how = f"loaded in {ds.loaded_in_s:.1f} s" if ds.loaded_in_s else "reused"
    print(
        f"data set: {ds.doctors} doctors x {ds.per_day} slots x {ds.days} days = "
        f"{ds.slots:,} slots ({how}); dates {ds.first_day} .. {ds.last_day}"
    )
    tmp = Path(tempfile.mkdtemp(prefix="reservo-reads-"))
    patients = benchlib.mint_patients(tmp / "patients.txt", 1_000_000, opts.patients)

    configs, results, ceilings = benchlib.sweep(
        opts,
        "slot_reads",
        lambda w, t, c, prof, server: one_run(ds, opts, w, t, c, patients, prof, server),
        describe,
        lambda r: r.reads_per_s,
        servers,
    )

    print(f"\nmedians over {opts.runs} run(s) of {opts.duration:.0f} s:")
    print(
        "server   workers  wrk          reads/s  p50 ms  p99 ms  non-200  reservo CPU ms/req"
        "  est. alone/s"
    )
    med = benchlib.median
    for server, w, t, c in dict.fromkeys(
        (r.server, r.workers, r.threads, r.connections) for r in results
    ):
        rs = [
            r
            for r in results
            if (r.server, r.workers, r.threads, r.connections) == (server, w, t, c)
        ]
        bad = sum(n for r in rs for k, n in r.statuses.items() if k != "200")
        print(
            f"{server:<8} {w:>7}  -t{t} -c{c:<4} {med([r.reads_per_s for r in rs]):>8,.0f}  "
            f"{med([r.p50_ms for r in rs]):>6.1f}  {med([r.p99_ms for r in rs]):>6.1f}  "
            f"{bad:>7}  {med([r.cpu['cpu_ms_per_req_reservo'] for r in rs]):>18.2f}"
            f"  {med([r.cpu['rate_if_machine_were_ours'] for r in rs]):>12,.0f}"
        )

    benchlib.ceiling_summary(configs, results, ceilings, lambda r: r.reads_per_s, "reads/s")
    if len(servers) > 1:
        benchlib.server_summary(results, ceilings, lambda r: r.reads_per_s, "reads/s")

    failures = [f"{r.workers}w/-c{r.connections}: {f}" for r in results for f in r.failures]
    return benchlib.finish(
        failures, opts.drop_db, "every read answered 200 with slots, no socket errors"
    )


if __name__ == "__main__":
    sys.exit(main())
