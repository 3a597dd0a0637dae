"""Latency at a fixed rate, not at saturation: the booking storm's attempts and
the slot reads sent at constant rates by open-loop clients (client.py, one
process per load), each alone and both at once, against `reservo api
--workers 2` and a `reservo worker`, everything on this machine.

    python bench/fixed_rate/run.py                      # the design notes' peaks, 20 s each
    python bench/fixed_rate/run.py --storm-rate 5000 --reads-rate 10000 --duration 20 --runs 3
    python bench/fixed_rate/run.py --only both --mix uniform

Prints, per load, p50 / p99 / p99.9 / max latency from each request's due
time (a queue at the client counts), the statuses (a problem's code beside
its status), requests not answered within ``--grace`` seconds of the end, and
the CPU per request of reservo, PostgreSQL and the client. Beside each figure:
the bare FastAPI hello (bench/hello_app.py, same server stack and worker
count) driven by the same client at the same total rate in the same
invocation. The storm's requests are booking_storm's (30 hot slots of 165
seats, a random patient of 20,000 with their own token, a fresh
Idempotency-Key each), the reads slot_reads' (``--mix``). After every run with
the storm, booking_storm's invariants are checked in SQL (no overbooking,
counters equal to rows, 201s within the bookings, one outbox event per
booking); any 5xx, an unanswered request or a broken invariant exits 1. Targets
(``--p99-ms``, ``--p999-ms``; default 10 and 50) are reported, not enforced.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import pickle
import random
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from datetime import timedelta
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))
import benchlib  # noqa: E402

# booking_storm/run.py: its hot slots, its invariants' check and its record of a run.
_spec = importlib.util.spec_from_file_location(
    "booking_storm_run", HERE.parent / "booking_storm" / "run.py"
)
assert _spec is not None and _spec.loader is not None
storm_run = importlib.util.module_from_spec(_spec)
sys.modules["booking_storm_run"] = storm_run  # its dataclasses look their module up
_spec.loader.exec_module(storm_run)
StormResult = storm_run.RunResult
check, prepare_slots = storm_run.check, storm_run.prepare_slots

SCENARIOS = ("storm", "reads", "both")


@dataclass
class Load:
    """One client's figures: what it sent, at what rate, and how it was answered."""

    name: str
    rate: float
    latency_ms: list[float]
    keys: list[str]
    client_cpu_s: float

    def pct(self, q: float) -> float:
        done = sorted(x for x, k in zip(self.latency_ms, self.keys, strict=True) if k != "0")
        return done[min(len(done) - 1, int(q * len(done)))] if done else float("nan")

    @property
    def unsent(self) -> int:
        return sum(1 for k in self.keys if k == "0")

    def statuses(self) -> dict[str, int]:
        out: dict[str, int] = {}
        for k in self.keys:
            out[k] = out.get(k, 0) + 1
        return dict(sorted(out.items()))

    def line(self) -> str:
        return (
            f"{self.name:<5} {self.rate:>7,.0f}/s  p50 {self.pct(0.5):6.2f}"
            f"  p99 {self.pct(0.99):7.2f}  p99.9 {self.pct(0.999):7.2f}"
            f"  max {max(self.latency_ms, default=0):7.1f} ms  unanswered {self.unsent}"
            f"  client CPU {1e6 * self.client_cpu_s / len(self.keys):.0f} us/req"
        )


@dataclass
class Outcome:
    scenario: str
    loads: list[Load]
    cpu: dict[str, float] = field(default_factory=dict)
    storm: Any = None  # booking_storm's RunResult
    hello: list[Load] = field(default_factory=list)

    def failures(self) -> list[str]:
        bad = [f"{ld.name}: {ld.unsent} unanswered" for ld in self.loads if ld.unsent]
        for ld in self.loads:
            bad += [f"{ld.name}: {n} x {k}" for k, n in ld.statuses().items() if k[0] == "5"]
            bad += [
                f"{ld.name}: {n} reads found no slot"
                for k, n in ld.statuses().items()
                if k == "200 empty"
            ]
        if self.storm is not None:
            bad += [f"storm: {f}" for f in self.storm.failures]
        return [f"{self.scenario}: {b}" for b in bad]


def storm_requests(port: int, files: Path, hot: list[int], n: int, run: str) -> list[bytes]:
    patients = [ln.split() for ln in files.read_text().splitlines() if ln]
    rnd = random.Random(run)
    out = []
    for i in range(n):
        pid, token = patients[rnd.randrange(len(patients))]
        body = f'{{"slotId":{hot[rnd.randrange(len(hot))]},"patientId":{pid}}}'.encode()
        out.append(
            (
                f"POST /api/appointments HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\n"
                f"Authorization: Bearer {token}\r\nContent-Type: application/json\r\n"
                f"Idempotency-Key: {run}-{i}\r\nContent-Length: {len(body)}\r\n\r\n"
            ).encode()
            + body
        )
    return out


def read_requests(port: int, files: Path, ds: benchlib.Dataset, mix: str, n: int) -> list[bytes]:
    """reads.lua's requests: ``skewed`` puts 80 % on the next 3 dates of the
    10 % most popular doctors, the rest uniform."""
    tokens = [ln.split()[1] for ln in files.read_text().splitlines() if ln]
    days = [(ds.first_day + timedelta(days=i)).isoformat() for i in range(ds.days)]
    popular = max(1, ds.doctors // 10)
    rnd = random.Random(n)
    out = []
    for _ in range(n):
        if mix == "skewed" and rnd.random() < 0.8:
            doctor, day = rnd.randint(1, popular), days[rnd.randrange(min(3, len(days)))]
        else:
            doctor, day = rnd.randint(1, ds.doctors), days[rnd.randrange(len(days))]
        out.append(
            (
                f"GET /api/doctors/{doctor}/slots?date={day} HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\n"
                f"Authorization: Bearer {tokens[rnd.randrange(len(tokens))]}\r\n\r\n"
            ).encode()
        )
    return out


def hello_requests(port: int, n: int) -> list[bytes]:
    return [f"GET /hello HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\n\r\n".encode()] * n


def drive(
    port: int, loads: list[tuple[str, float, list[bytes]]], opts: argparse.Namespace, tmp: Path
) -> list[Load]:
    """Runs one client process per load, all at once; their figures."""
    procs = []
    for name, rate, reqs in loads:
        src, out = tmp / f"{name}.pickle", tmp / f"{name}.json"
        src.write_bytes(pickle.dumps(reqs))
        cmd = [
            sys.executable, str(HERE / "client.py"), "--requests", str(src), "--port", str(port),
            "--rate", str(rate), "--connections", str(opts.connections),
            "--grace", str(opts.grace), "--out", str(out),
        ]  # fmt: skip
        procs.append((name, rate, out, subprocess.Popen(cmd)))
    result = []
    for name, rate, out, proc in procs:
        if proc.wait() != 0:
            raise RuntimeError(f"the {name} client failed")
        got = json.loads(out.read_text())
        result.append(Load(name, rate, got["latency_ms"], got["keys"], got["cpu_s"]))
    return result


def wanted(scenario: str, opts: argparse.Namespace) -> list[tuple[str, float]]:
    storm, reads = ("storm", opts.storm_rate), ("reads", opts.reads_rate)
    return {"storm": [storm], "reads": [reads], "both": [storm, reads]}[scenario]


def one_run(
    scenario: str, ds: benchlib.Dataset, opts: argparse.Namespace, files: dict[str, Path], tmp: Path
) -> Outcome:
    hot, capacity, warm_slots = benchlib.run_async(prepare_slots(ds))
    benchlib.clear_redis_namespace()
    run = f"fr{time.time_ns()}"
    env = {"RESERVO_DB_POOL_MAX": str(opts.pool_max)} if opts.pool_max else {}
    with benchlib.Reservo(opts.workers, env) as rv:
        port = rv.port
        n = {name: int(rate * opts.duration) for name, rate in wanted(scenario, opts)}
        build = {
            "storm": lambda k: storm_requests(port, files["storm"], hot, k, run),
            "reads": lambda k: read_requests(port, files["reads"], ds, opts.mix, k),
        }
        if opts.warmup > 0:  # connections, pools, statements: reads, and bookings by
            # other patients on slots that never fill (booking_storm's warm-up)
            k = int(opts.reads_rate * opts.warmup)
            warm = [("warm-reads", opts.reads_rate, build["reads"](k))]
            if "storm" in n:
                k = int(opts.storm_rate * opts.warmup)
                reqs = storm_requests(port, files["warm"], warm_slots, k, f"w{run}")
                warm.append(("warm-storm", opts.storm_rate, reqs))
            drive(port, warm, opts, tmp)
            time.sleep(1.0)
        reqs = [(name, rate, build[name](n[name])) for name, rate in wanted(scenario, opts)]
        with benchlib.CpuMeter(rv) as cpu:
            loads = drive(port, reqs, opts, tmp)
        for line in rv.error_lines()[:5]:
            print(f"  logged: {line[:200]}", file=sys.stderr)
    # Per answered request: what was never sent cost nothing.
    total = sum(len(ld.keys) - ld.unsent for ld in loads)
    outcome = Outcome(scenario, loads, cpu.figures(total, sum(ld.client_cpu_s for ld in loads)))
    if "storm" in n:
        facts = benchlib.run_async(check(hot))
        storm = next(ld for ld in loads if ld.name == "storm")
        outcome.storm = storm_result(storm, capacity, facts)
    return outcome


def storm_result(storm: Load, capacity: int, facts: dict[str, int]) -> Any:
    """booking_storm's record of the run, for its invariants."""
    statuses = storm.statuses()
    return StormResult(
        workers=2, threads=0, connections=0, attempts_per_s=storm.rate,
        requests=len(storm.keys), statuses=statuses, p50_ms=storm.pct(0.5),
        p90_ms=storm.pct(0.9), p99_ms=storm.pct(0.99), max_ms=max(storm.latency_ms),
        socket_errors={}, peak_rss_mb=0, peak_pss_mb=0, peak_rss_by_process_mb={},
        hot_capacity=capacity, created_201=statuses.get("201", 0), errors_logged=0, cpu={},
        **facts,
    )  # fmt: skip


def hello_run(scenario: str, opts: argparse.Namespace, tmp: Path) -> list[Load]:
    """The same client at the same total rate against the bare hello."""
    with benchlib.hello_server(opts.workers) as port:
        loads = [
            (f"hello-{name}", rate, hello_requests(port, int(rate * opts.duration)))
            for name, rate in wanted(scenario, opts)
        ]
        return drive(port, loads, opts, tmp)


def describe(o: Outcome, opts: argparse.Namespace) -> str:
    lines = [f"{o.scenario}:"]
    for ld in o.loads:
        target = (
            "met" if ld.pct(0.99) <= opts.p99_ms and ld.pct(0.999) <= opts.p999_ms else "NOT met"
        )
        lines.append(f"  {ld.line()}  target {target}")
        lines.append(f"        statuses {ld.statuses()}")
    lines += [f"  ceiling {h.line()}" for h in o.hello]
    lines.append(f"  {benchlib.describe_cpu(o.cpu)}")
    if o.storm is not None:
        s = o.storm
        lines.append(
            f"  invariants: {s.booked_hot} hot bookings of {s.hot_capacity} seats, "
            f"{s.overbooked_slots} overbooked, {s.mismatched_slots} mismatched, "
            f"{s.outbox_events}/{s.appointments_total} outbox events"
        )
    return "\n".join(lines)


def summary(outcomes: list[Outcome]) -> None:
    print("\nmedians over the runs (ms; the hello at the same rate in parentheses):")
    print(
        "scenario  load    rate/s      p50             p99             p99.9"
        "           reservo CPU us/req"
    )
    med = benchlib.median
    for scenario in dict.fromkeys(o.scenario for o in outcomes):
        runs = [o for o in outcomes if o.scenario == scenario]
        for i, ld in enumerate(runs[0].loads):
            fig = []
            for q in (0.5, 0.99, 0.999):
                ours = med([o.loads[i].pct(q) for o in runs])
                fig.append(f"{ours:6.2f} ({med([o.hello[i].pct(q) for o in runs]):5.2f})")
            cpu = med([1000 * o.cpu["cpu_ms_per_req_reservo"] for o in runs])
            print(f"{scenario:<9} {ld.name:<6} {ld.rate:>7,.0f}  {'  '.join(fig)}  {cpu:>8.0f}")


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--storm-rate", type=float, default=5000, help="booking attempts/s")
    p.add_argument("--reads-rate", type=float, default=10000, help="slot reads/s")
    p.add_argument("--duration", type=float, default=20, help="seconds per load and run")
    p.add_argument("--runs", type=int, default=1, help="runs per scenario (medians)")
    p.add_argument("--only", default="storm,reads,both", help="scenarios, comma-separated")
    p.add_argument("--mix", choices=["uniform", "skewed"], default="skewed")
    p.add_argument("--workers", type=int, default=2)
    p.add_argument("--connections", type=int, default=128, help="per client")
    p.add_argument("--warmup", type=float, default=3, help="seconds of reads before each run")
    p.add_argument("--grace", type=float, default=5, help="seconds after the last due request")
    p.add_argument("--pool-max", type=int, default=10)
    p.add_argument("--p99-ms", type=float, default=10)
    p.add_argument("--p999-ms", type=float, default=50)
    p.add_argument("--doctors", type=int, default=2000)
    p.add_argument("--days", type=int, default=14)
    p.add_argument("--json", type=Path, help="append every run's percentiles to this file")
    opts = p.parse_args(argv)
    scenarios = [s for s in opts.only.split(",") if s]
    if set(scenarios) - set(SCENARIOS):
        p.error(f"--only takes {', '.join(SCENARIOS)}")
    benchlib.stop_cleanly_on_signals()
    print(f"machine: {benchlib.machine()}")
    print(f"reservo code under test: {benchlib.reservo_source()}")
    ds = benchlib.run_async(benchlib.ensure_dataset(opts.doctors, opts.days, 40, False))
    tmp = Path(tempfile.mkdtemp(prefix="reservo-fixed-rate-"))
    files = {
        "storm": benchlib.mint_patients(tmp / "patients.txt", 1_000_000, 20_000),
        "reads": benchlib.mint_patients(tmp / "readers.txt", 3_000_000, 5_000),
        "warm": benchlib.mint_patients(tmp / "warm.txt", 2_000_000, 20_000),
    }
    outcomes = []
    for r in range(opts.runs):
        for scenario in scenarios:
            o = one_run(scenario, ds, opts, files, tmp)
            o.hello = hello_run(scenario, opts, tmp)
            print(
                f"\nrun {r + 1}, load avg {os.getloadavg()[0]:.1f}; " + describe(o, opts),
                flush=True,
            )
            outcomes.append(o)
            if opts.json:
                with opts.json.open("a") as f:
                    f.write(json.dumps(record(o)) + "\n")
    summary(outcomes)
    failures = [f for o in outcomes for f in o.failures()]
    return benchlib.finish(
        failures, False, "zero 5xx, every request answered, the storm's invariants hold"
    )


def record(o: Outcome) -> dict[str, object]:
    def figs(ld: Load) -> dict[str, object]:
        qs = {f"p{q * 100:g}_ms": ld.pct(q) for q in (0.5, 0.99, 0.999)}
        return {
            "name": ld.name,
            "rate": ld.rate,
            **qs,
            "unsent": ld.unsent,
            "statuses": ld.statuses(),
        }

    return {
        "scenario": o.scenario,
        "loads": [figs(ld) for ld in o.loads],
        "hello": [figs(ld) for ld in o.hello],
        "cpu": o.cpu,
    }


if __name__ == "__main__":
    sys.exit(main())
