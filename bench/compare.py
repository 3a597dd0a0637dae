"""This tree's speed beside a release's, on the same machine in the same minutes.

    python bench/compare.py --against 0.3.0
    python bench/compare.py --against 0.3.0 --duration 5 --rounds 1 --only storm,scheduler
    python bench/compare.py --against 0.2.0 --report-only --markdown /tmp/cmp.md

The release (a git tag, else a name in bench/releases.toml, else any commit) is
checked out into a temporary git worktree and gets a virtualenv of its own,
cached by commit under --cache-dir; this tree gets one too, cached by its
pyproject.toml. Each headline benchmark then runs as each tree's own script
against that tree's own code (PYTHONPATH, venv), the two trees interleaved round
by round (the first side alternates), and the table gives every figure's median
on both sides and the gain, oriented so that above 1 is better (new/old for a
rate, old/new for a latency, a CPU cost or a duration).

Exit status: 0; 1 when a gain is under --threshold (0.95) and --report-only is
not given; 2 when a benchmark run failed (its invariants, a crash, an output
without its figures) or the release could not be set up.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from dataclasses import asdict
from pathlib import Path

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table

sys.path.insert(0, str(Path(__file__).resolve().parent))
from comparison import table as tables
from comparison.benches import Bench, Sizes, select
from comparison.figures import UnreadableOutput
from comparison.trees import (
    Side,
    checked_out,
    describe_work_tree,
    resolve,
    venv_for,
    venv_key,
)

REPO = Path(__file__).resolve().parents[1]
CACHE = Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache")) / "reservo-compare"


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(
        prog="bench/compare.py",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument(
        "--against", required=True, help="the release: tag, bench/releases.toml name or commit"
    )
    p.add_argument(
        "--duration", type=float, default=10, help="seconds of load per run (default 10)"
    )
    p.add_argument("--rounds", type=int, default=3, help="runs per benchmark and side (default 3)")
    p.add_argument(
        "--only",
        help="a comma list of: storm, reads-skewed, reads-uniform, transfers, jobs, scheduler, "
        "settlement (default: all)",
    )
    p.add_argument("--backlog", type=int, default=100_000, help="jobs the scheduler drains")
    p.add_argument("--bets", type=int, default=100_000, help="bets the settlement settles")
    p.add_argument(
        "--threshold",
        type=float,
        default=tables.REGRESSION_BELOW,
        help="a gain under this is a regression (default 0.95)",
    )
    p.add_argument(
        "--report-only", action="store_true", help="exit 0 on a regression (still 2 on a failure)"
    )
    p.add_argument(
        "--cache-dir", type=Path, default=CACHE, help=f"venvs live here (default {CACHE})"
    )
    p.add_argument("--logs", type=Path, help="each run's output goes here (default: a temp dir)")
    p.add_argument("--markdown", type=Path, help="write the table, with the command and machine")
    p.add_argument("--json", type=Path, help="write every run's figures")
    return p.parse_args(argv)


class Runner:
    """Runs one benchmark on one side and reads its figures."""

    def __init__(self, sizes: Sizes, logs: Path, timeout_s: float) -> None:
        self.sizes, self.logs, self.timeout_s = sizes, logs, timeout_s

    def run(self, bench: Bench, side: Side, key: str, round_: int) -> tuple[dict[str, float], str]:
        """The run's figures and its command; UnreadableOutput or RuntimeError when
        it failed (the log file is named in the message)."""
        stem = self.logs / f"{bench.name}-{key}-round{round_ + 1}"
        json_file = stem.with_suffix(".jsonl") if bench.writes_json else None
        if json_file is not None:
            json_file.unlink(missing_ok=True)
        cmd = [str(side.python), *bench.command(side.tree, self.sizes, json_file)]
        log = stem.with_suffix(".log")
        with log.open("w") as out:
            proc = subprocess.Popen(
                cmd, cwd=side.tree, env=side.env(), stdout=out, stderr=subprocess.STDOUT
            )
            try:
                code = proc.wait(self.timeout_s)
            except subprocess.TimeoutExpired:
                proc.terminate()  # the runners stop what they started on SIGTERM
                try:
                    proc.wait(60)
                except subprocess.TimeoutExpired:
                    proc.kill()
                    proc.wait()
                raise RuntimeError(f"timed out after {self.timeout_s:.0f} s; see {log}") from None
        stdout = log.read_text(errors="replace")
        shown = " ".join(cmd[1:]).replace(str(side.tree) + "/", "")
        if json_file is not None:
            shown = shown.replace(str(json_file), "FILE")
        if code != 0:
            raise RuntimeError(f"exit {code}; see {log}")
        self._check_code_under_test(stdout, side, log)
        json_text = json_file.read_text() if json_file is not None and json_file.exists() else None
        try:
            return bench.read(stdout, json_text), shown
        except UnreadableOutput as e:
            raise UnreadableOutput(f"{e}; see {log}") from None

    @staticmethod
    def _check_code_under_test(stdout: str, side: Side, log: Path) -> None:
        for line in stdout.splitlines():
            if line.startswith("reservo code under test:"):
                ran = line.split(":", 1)[1].strip()
                if not ran.startswith(str(side.tree)):
                    raise RuntimeError(f"ran {ran}, not {side.tree}; see {log}")


def prepare(
    console: Console, tree: Path, commit: str | None, name: str, cache: Path, logs: Path, db: str
) -> Side:
    """The side's venv (built once per commit or pyproject.toml) and a check that
    its interpreter imports the side's own package."""
    key = venv_key(tree, commit)
    with console.status(f"venv for {name} ({cache / 'venvs' / key}) ..."):
        started = time.monotonic()
        python, built = venv_for(tree, key, cache, logs / f"venv-{key[:16]}.log")
    if built:
        console.print(f"built the venv for {name} in {time.monotonic() - started:.0f} s")
    side = Side(name, tree, python, db)
    found = subprocess.run(
        [str(python), "-c", "import reservo; print(reservo.__file__)"],
        env=side.env(),
        capture_output=True,
        text=True,
        check=False,
    ).stdout.strip()
    if not found.startswith(str(tree / "src")):
        raise RuntimeError(f"{name}'s interpreter imports {found or 'no reservo'}, not {tree}/src")
    return side


def rich_table(lines: list[tables.Line], old: str, new: str, threshold: float) -> Table:
    t = Table(title=f"{new} against {old}: medians, every round in parentheses")
    for i, head in enumerate(tables.HEADER):
        t.add_column(
            old if i == 3 else new if i == 4 else head, justify="right" if i >= 3 else "left"
        )
    for row in tables.rows(lines, threshold):
        t.add_row(*row[:-1], f"[bold red]{row[-1]}[/]" if row[-1] else "")
    return t


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    # A log file gets the table's full width (rich would wrap it at 80 columns).
    console = Console(width=None if sys.stdout.isatty() else 160)
    try:
        benches = select(args.only)
        commit = resolve(args.against, REPO)
    except (ValueError, LookupError) as e:
        console.print(f"[red]{e}[/]")
        return 2
    sizes = Sizes(duration=args.duration, backlog=args.backlog, bets=args.bets)
    logs = args.logs or Path(time.strftime("/tmp/reservo-compare-%Y%m%d-%H%M%S"))
    logs.mkdir(parents=True, exist_ok=True)
    started, load0 = time.time(), os.getloadavg()[0]
    old_name = f"{args.against} ({commit[:7]})"
    new_name = f"this tree ({describe_work_tree(REPO)})"
    console.print(f"{new_name} against {old_name}; logs in {logs}")

    samples: list[tables.Sample] = []
    failures: list[str] = []
    commands: dict[str, str] = {}
    with checked_out(REPO, commit) as old_tree:
        try:
            sides = {
                "old": prepare(console, old_tree, commit, old_name, args.cache_dir, logs,
                               f"reservo_bench_cmp_{commit[:10]}"),
                "new": prepare(console, REPO, None, new_name, args.cache_dir, logs,
                               "reservo_bench_cmp_work"),
            }  # fmt: skip
        except RuntimeError as e:
            console.print(f"[red]{e}[/]")
            return 2
        runnable = []
        for bench in benches:
            missing = [
                f"{side.name}: {why}"
                for side in sides.values()
                if (why := bench.missing_in(side.tree)) is not None
            ]
            if missing:
                failures.append(f"{bench.name} not run: {'; '.join(missing)}")
            else:
                runnable.append(bench)
        runner = Runner(sizes, logs, timeout_s=30 * args.duration + 1800)
        with Progress(
            TextColumn("{task.description}"),
            BarColumn(),
            MofNCompleteColumn(),
            TimeElapsedColumn(),
            console=console,
        ) as progress:
            task = progress.add_task("runs", total=args.rounds * len(runnable) * 2)
            for round_ in range(args.rounds):
                for bench in runnable:
                    # The first side alternates, so a drift of the machine favours neither.
                    for key in ("old", "new") if round_ % 2 == 0 else ("new", "old"):
                        side = sides[key]
                        label = f"round {round_ + 1}/{args.rounds} {bench.name} {side.name}"
                        progress.update(task, description=label)
                        try:
                            figures, shown = runner.run(bench, side, key, round_)
                        except (RuntimeError, UnreadableOutput) as e:
                            failures.append(f"{bench.name} on {side.name}, round {round_ + 1}: {e}")
                            progress.console.print(f"[red]FAILED[/] {failures[-1]}")
                        else:
                            samples.append(tables.Sample(bench.name, key, figures))
                            commands.setdefault(bench.name, shown)
                            progress.console.print(
                                f"round {round_ + 1} {bench.name:<13} {key}: "
                                + ", ".join(f"{k} {tables.number(v)}" for k, v in figures.items())
                            )
                        progress.advance(task)

    lines = tables.lines(
        [(b.heading(sizes), b.figures) for b in benches], _headed(samples, benches, sizes)
    )
    took = time.time() - started
    console.print(rich_table(lines, old_name, new_name, args.threshold))
    regressions = [ln for ln in lines if ln.regressed(args.threshold)]
    summary = (
        f"{args.rounds} round(s) of {args.duration:g} s, {len(regressions)} regression(s), "
        f"{len(failures)} failure(s); took {took / 60:.0f} min; load average "
        f"{load0:.1f} at the start, {os.getloadavg()[0]:.1f} at the end ({os.cpu_count()} cores)"
    )
    console.print(summary)
    for f in failures:
        console.print(f"[red]{f}[/]")
    for name, shown in commands.items():
        console.print(f"  {name}: python {shown}", highlight=False, soft_wrap=True)
    if args.markdown:
        args.markdown.write_text(
            _markdown_report(args, lines, old_name, new_name, summary, failures, commands, started)
        )
    if args.json:
        args.json.write_text(
            json.dumps(
                {"against": old_name, "tree": new_name, "samples": [asdict(s) for s in samples],
                 "failures": failures, "took_s": took},
                indent=2,
            )
        )  # fmt: skip
    if failures:
        return 2
    return 1 if regressions and not args.report_only else 0


def _headed(
    samples: list[tables.Sample], benches: list[Bench], sizes: Sizes
) -> list[tables.Sample]:
    """The samples under their benchmark's heading, as the table's lines are keyed."""
    heading = {b.name: b.heading(sizes) for b in benches}
    return [tables.Sample(heading[s.bench], s.side, s.figures) for s in samples]


def _markdown_report(
    args: argparse.Namespace,
    lines: list[tables.Line],
    old: str,
    new: str,
    summary: str,
    failures: list[str],
    commands: dict[str, str],
    started: float,
) -> str:
    when = time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime(started))
    argv = " ".join(sys.argv[1:])
    text = [
        f"`python bench/compare.py {argv}`, started {when}: {summary}.",
        "",
        tables.markdown(lines, old, new, args.threshold),
    ]
    text += [f"- failed: {f}" for f in failures]
    text += [f"- {name}: `python {shown}`" for name, shown in commands.items()]
    return "\n".join(text) + "\n"


if __name__ == "__main__":
    sys.exit(main())
