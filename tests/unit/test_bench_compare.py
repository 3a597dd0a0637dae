"""bench/compare.py's pure parts: each headline benchmark's output read back into
figures (in this release's format and the first release's), the medians, gains and
regression flags of the table, and the release list it resolves names through."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
from bench.comparison.benches import BENCHES, Sizes, select
from bench.comparison.figures import (
    Figure,
    UnreadableOutput,
    scheduler_figures,
    settlement_figures,
    wrk_run_figures,
)
from bench.comparison.table import Line, Sample, lines, markdown, number, rows
from bench.comparison.trees import release_commit

ROOT = Path(__file__).resolve().parents[2]
RATE = Figure("rate", "attempts/s", higher_is_better=True)
P99 = Figure("p99_ms", "p99 ms", higher_is_better=False)


def storm_record(**overrides: object) -> str:
    """One line of booking_storm/run.py --json (benchlib.sweep), the fields read here."""
    record = {
        "bench": "booking_storm",
        "workers": 2,
        "threads": 2,
        "connections": 128,
        "attempts_per_s": 12698.4,
        "p50_ms": 8.1,
        "p99_ms": 100.2,
        "statuses": {"201": 165, "409 slot_full": 180000},
        "cpu": {"cpu_ms_per_req_reservo": 0.11, "rate_if_machine_were_ours": 20000.0},
        "duration_s": 10,
    }
    record.update(overrides)
    return json.dumps(record) + "\n"


def test_a_wrk_runners_record_gives_its_rate_p99_and_cpu_per_request() -> None:
    assert wrk_run_figures(storm_record(), "attempts_per_s") == {
        "rate": 12698.4,
        "p99_ms": 100.2,
        "cpu_ms_per_req": 0.11,
    }


def test_a_record_without_cpu_figures_gives_the_others() -> None:
    assert wrk_run_figures(storm_record(cpu={}), "attempts_per_s") == {
        "rate": 12698.4,
        "p99_ms": 100.2,
    }


@pytest.mark.parametrize("text", ["", storm_record() + storm_record()])
def test_anything_but_one_record_is_unreadable(text: str) -> None:
    with pytest.raises(UnreadableOutput, match="one JSON record"):
        wrk_run_figures(text, "attempts_per_s")


def test_a_record_of_another_benchmark_is_unreadable() -> None:
    with pytest.raises(UnreadableOutput, match="reads_per_s"):
        wrk_run_figures(storm_record(), "reads_per_s")


# bench/scheduler/bench.py's lines as this release prints them...
SCHEDULER_NOW = """load average at start: 1.2 (2 cores)
enqueued 100000 due jobs (bulk) at 61,234 jobs/s
drain: 100000 due jobs in 19.7 s with 2 worker processes: 5,076 jobs/s overall (from the \
workers' start), 5,412 jobs/s from the first completion to the last; CPU s: workers 20.1, \
postgres 12.0, redis 1.1 (2 cores x 19.7 s = 39.4); per job: workers 201 us, postgres 120 us, \
redis 11 us; PostgreSQL statements per job 0.031, rows written per job 3.02
  table scheduled_job n_tup_ins 100000
fire 2000/s for 15s (5s warm-up) [clean]: done 30000/30000, lost 0, duplicate completions 0, \
reaped attempts 0; lateness (handler start) ms over 20000 jobs: min 0.00 p50 0.2 p99 1.4 max 9.8
load average at end: 1.9
"""
# ...and as the first release (05f2ba6) printed them.
SCHEDULER_0_1_0 = """drain: 100000 due jobs in 25.0 s with 2 worker processes: 4,000 jobs/s \
overall, 4,100 jobs/s after the first completion
fire 2000/s for 15s (5s warm-up) [clean]: done 30000/30000, lost 0, duplicate completions 0, \
reaped attempts 0; lateness (handler start) ms over 20000 jobs: p50 3.0 p99 12.5 max 40.1
"""


@pytest.mark.parametrize(
    ("stdout", "drain", "p99"), [(SCHEDULER_NOW, 5076.0, 1.4), (SCHEDULER_0_1_0, 4000.0, 12.5)]
)
def test_the_scheduler_gives_its_drain_rate_and_clean_p99(
    stdout: str, drain: float, p99: float
) -> None:
    assert scheduler_figures(stdout) == {"drain_per_s": drain, "lateness_p99_ms": p99}


def test_a_fault_fire_alone_is_not_the_lateness_figure() -> None:
    fault_only = SCHEDULER_NOW.replace("[clean]", "[fault (redis restart)]")
    with pytest.raises(UnreadableOutput):
        scheduler_figures(fault_only)


SETTLEMENT = """seeded 100000 + 0 bets in 12.3s
bets=100000 unrelated=0 chunk=5000 parallel=2
  all bets settled      2.91 s  (unsettled left: 0)
  all payouts credited  3.02 s  (41000 credits for 41000 winning/void bets, upper bound 50000)
  all notifications     3.10 s  (100000 settled-bet notifications)
  total                 3.10 s  = 1,935,484 bets/min
  worker peak RSS       120 MB
"""


def test_the_settlement_gives_its_total_seconds() -> None:
    assert settlement_figures(SETTLEMENT) == {"total_s": 3.10}


def test_a_settlement_that_left_bets_unsettled_has_no_figure() -> None:
    with pytest.raises(UnreadableOutput, match="7 bets left unsettled"):
        settlement_figures(SETTLEMENT.replace("unsettled left: 0", "unsettled left: 7"))


def test_the_gain_is_oriented_so_that_above_one_is_better() -> None:
    faster = Line("storm", RATE, old=[100, 90, 110], new=[120, 130, 110])
    assert faster.old_median == 100 and faster.new_median == 120
    assert faster.gain == pytest.approx(1.2)
    slower_p99 = Line("storm", P99, old=[10, 10, 10], new=[20, 20, 20])
    assert slower_p99.gain == pytest.approx(0.5)
    assert slower_p99.regressed() and not faster.regressed()


def test_a_regression_is_a_gain_under_the_threshold() -> None:
    at = Line("storm", RATE, old=[100], new=[95])
    under = Line("storm", RATE, old=[100], new=[94.9])
    assert not at.regressed(0.95)
    assert under.regressed(0.95)
    assert not under.regressed(0.9)


def test_the_table_takes_medians_not_means_and_keeps_every_round() -> None:
    # One noisy round (the 10) moves a mean by a third; the median ignores it.
    (line,) = lines(
        [("storm", [RATE])],
        [
            Sample("storm", "old", {"rate": 100.0}),
            Sample("storm", "new", {"rate": 101.0}),
            Sample("storm", "new", {"rate": 10.0}),
            Sample("storm", "old", {"rate": 99.0}),
            Sample("storm", "old", {"rate": 101.0}),
            Sample("storm", "new", {"rate": 100.0}),
            Sample("other", "new", {"rate": 1.0}),  # a benchmark not asked for
        ],
    )
    assert line.old == [100.0, 99.0, 101.0] and line.new == [101.0, 10.0, 100.0]
    assert line.gain == pytest.approx(1.0)
    (row,) = rows([line])
    assert row == ("storm", "attempts/s", "higher", "100 (100 / 99.0 / 101)",
                   "100 (101 / 10.0 / 100)", "1.00", "")  # fmt: skip


def test_rows_flag_a_regression_and_a_side_without_figures() -> None:
    table = [
        Line("reads", P99, old=[10.0], new=[11.0]),
        Line("jobs", RATE, old=[100.0], new=[]),
    ]
    assert [r[-1] for r in rows(table)] == ["REGRESSION (< 0.95)", "NO FIGURE"]
    assert [r[-2] for r in rows(table)] == ["0.91", "n/a"]
    assert rows(table)[1][3:5] == ("100 (100)", "n/a")
    text = markdown(table, "0.3.0 (53e1db8)", "this tree (53e1db8)")
    assert text.splitlines()[0] == (
        "| benchmark | figure | better | 0.3.0 (53e1db8) | this tree (53e1db8) "
        "| gain (>1 better) |  |"
    )
    assert "| **REGRESSION (< 0.95)** |" in text


@pytest.mark.parametrize(
    ("value", "shown"), [(12698.4, "12,698"), (100.2, "100"), (57.35, "57.4"), (0.114, "0.11")]
)
def test_numbers_are_shown_as_a_reader_compares_them(value: float, shown: str) -> None:
    assert number(value) == shown


def test_every_release_the_changelog_names_is_listed_at_its_last_commit() -> None:
    sections = (ROOT / "CHANGELOG.md").read_text().split("\n## ")[1:]
    named = [
        (section.split()[0], found[1])
        for section in sections
        if (found := re.search(r"last commit `([0-9a-f]+)`", section))
    ]
    listed = (ROOT / "bench" / "releases.toml").read_text()
    assert {"0.1.0", "0.2.0"} <= {name for name, _ in named}
    for name, commit in named:
        assert release_commit(name, listed) == commit, name
    assert release_commit("0.3.0", listed) == "53e1db8"
    assert release_commit("9.9.9", listed) is None


def test_flags_an_older_runner_does_not_know_are_left_out(tmp_path: Path) -> None:
    (storm,) = select("storm")
    script = tmp_path / storm.script
    script.parent.mkdir(parents=True)
    script.write_text('p.add_argument("--duration")\np.add_argument("--json")\n')
    old = storm.command(tmp_path, Sizes(duration=5), tmp_path / "runs.jsonl")
    assert "--ceiling-duration" not in old
    assert old[-2:] == ["--json", str(tmp_path / "runs.jsonl")]
    (tmp_path / "bench" / "benchlib.py").write_text('p.add_argument("--ceiling-duration")\n')
    new = storm.command(tmp_path, Sizes(duration=5), tmp_path / "runs.jsonl")
    assert new[new.index("--ceiling-duration") + 1] == "0"
    assert new[new.index("--duration") + 1] == "5"


def test_a_release_without_the_runner_or_its_json_output_cannot_run_it(tmp_path: Path) -> None:
    (transfers,) = select("transfers")
    assert transfers.missing_in(tmp_path) == "no bench/transfers/run.py"
    script = tmp_path / transfers.script
    script.parent.mkdir(parents=True)
    script.write_text('p.add_argument("--duration")\n')  # as 0.1.0's runner
    assert transfers.missing_in(tmp_path) == "its bench/transfers/run.py has no --json"
    assert [b.name for b in BENCHES if b.missing_in(ROOT) is not None] == []


def test_an_unknown_benchmark_name_is_refused() -> None:
    assert [b.name for b in select("reads-skewed,settlement")] == ["reads-skewed", "settlement"]
    with pytest.raises(ValueError, match="storms"):
        select("storms")
