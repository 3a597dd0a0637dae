"""The headline benchmarks (README.md's table), each as the command bench/compare.py
runs in a tree and the figures it reads from that run.

A flag listed in ``optional`` is passed only to a tree whose script (or its
benchlib.py) names it: an older release's runner may predate it.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from .figures import Figure, scheduler_figures, settlement_figures, wrk_run_figures


@dataclass(frozen=True)
class Sizes:
    """What a comparison run sizes: seconds of load per run, the scheduler's
    backlog, the settlement's bets."""

    duration: float = 10
    backlog: int = 100_000
    bets: int = 100_000


@dataclass(frozen=True)
class Bench:
    name: str
    title: str
    script: str
    args: Callable[[Sizes], list[str]]
    figures: tuple[Figure, ...]
    # (stdout, the --json file's text or None) -> figures by key
    read: Callable[[str, str | None], dict[str, float]]
    writes_json: bool = False
    optional: tuple[tuple[str, ...], ...] = field(default=())

    def heading(self, sizes: Sizes) -> str:
        return self.title.format(**dataclasses.asdict(sizes))

    def command(self, tree: Path, sizes: Sizes, json_file: Path | None) -> list[str]:
        """The script's arguments for ``tree``: optional flags its script does not know
        are left out."""
        known = _source(tree, self.script)
        args = self.args(sizes)
        for flag in self.optional:
            if flag[0] in known:
                args += list(flag)
        if self.writes_json and json_file is not None:
            args += ["--json", str(json_file)]
        return [str(tree / self.script), *args]

    def missing_in(self, tree: Path) -> str | None:
        """Why ``tree`` cannot run this benchmark (no script, or no --json where its
        figures are read from it), or None."""
        if not (tree / self.script).exists():
            return f"no {self.script}"
        if self.writes_json and "--json" not in _source(tree, self.script):
            return f"its {self.script} has no --json"
        return None


def _source(tree: Path, script: str) -> str:
    """The script's text and its tree's benchlib.py, where its options may be defined."""
    texts = [tree / script, tree / "bench" / "benchlib.py"]
    return "\n".join(p.read_text() for p in texts if p.exists())


def _wrk(rate_key: str, unit: str) -> Callable[[str, str | None], dict[str, float]]:
    def read(_stdout: str, json_text: str | None) -> dict[str, float]:
        return wrk_run_figures(json_text or "", rate_key)

    read.__doc__ = f"{unit} from the --json record"
    return read


def _wrk_figures(unit: str) -> tuple[Figure, ...]:
    return (
        Figure("rate", unit, higher_is_better=True),
        Figure("p99_ms", "p99 ms", higher_is_better=False),
        Figure("cpu_ms_per_req", "reservo CPU ms/req", higher_is_better=False),
    )


# Only one configuration and no hello ceiling: the other side of the comparison
# is the reference, measured in the same minutes.
_ONE_RUN = ("--runs", "1", "--workers", "2")
_NO_CEILING = (("--ceiling-duration", "0"),)


def _seconds(sizes: Sizes) -> list[str]:
    return ["--duration", f"{sizes.duration:g}"]


def _wrk_bench(name: str, title: str, script: str, unit: str, rate_key: str, *extra: str) -> Bench:
    """A wrk load of ``script`` (one configuration, no ceiling), its rate in ``unit``
    read from the --json record's ``rate_key``; ``extra``: the script's own flags."""
    return Bench(
        name,
        title,
        script,
        lambda s: [*_seconds(s), *_ONE_RUN, *extra],
        _wrk_figures(unit),
        _wrk(rate_key, unit),
        writes_json=True,
        optional=_NO_CEILING,
    )


_SLOT_READS = "bench/slot_reads/run.py"

BENCHES: tuple[Bench, ...] = (
    _wrk_bench(
        "storm", "booking storm", "bench/booking_storm/run.py", "attempts/s", "attempts_per_s"
    ),
    _wrk_bench(
        "reads-skewed",
        "slot reads, skewed",
        _SLOT_READS,
        "reads/s",
        "reads_per_s",
        *("--mix", "skewed", "--warmup", "5"),
    ),
    _wrk_bench(
        "reads-uniform",
        "slot reads, uniform",
        _SLOT_READS,
        "reads/s",
        "reads_per_s",
        *("--mix", "uniform", "--warmup", "5"),
    ),
    _wrk_bench(
        "transfers",
        "HTTP transfers",
        "bench/transfers/run.py",
        "transfers/s",
        "transfers_per_s",
        *("--accounts", "1000"),
    ),
    _wrk_bench("jobs", "POST /api/jobs", "bench/jobs/run.py", "enqueues/s", "enqueues_per_s"),
    Bench(
        "scheduler",
        "scheduler: {backlog:,} jobs drained, lateness",
        "bench/scheduler/bench.py",
        lambda s: [
            "--phases",
            "drain,fire",
            "--backlog",
            str(s.backlog),
            "--warmup",
            "5",
            "--seconds",
            str(max(1, round(s.duration))),
        ],
        (
            Figure("drain_per_s", "drain jobs/s", higher_is_better=True),
            Figure("lateness_p99_ms", "p99 lateness ms at 2,000/s", higher_is_better=False),
        ),
        lambda stdout, _json: scheduler_figures(stdout),
    ),
    Bench(
        "settlement",
        "settlement of {bets:,} bets",
        "bench/settlement/run.py",
        lambda s: ["--bets", str(s.bets)],
        (Figure("total_s", "s until settled, paid, notified", higher_is_better=False),),
        lambda stdout, _json: settlement_figures(stdout),
        optional=(("--placements", "0"),),
    ),
)


def select(only: str | None) -> list[Bench]:
    """The benchmarks named in a comma list (all of them without one)."""
    if not only:
        return list(BENCHES)
    names = [n.strip() for n in only.split(",") if n.strip()]
    by_name = {b.name: b for b in BENCHES}
    unknown = [n for n in names if n not in by_name]
    if unknown:
        raise ValueError(f"unknown benchmark(s) {unknown}; known: {', '.join(by_name)}")
    return [by_name[n] for n in names]
