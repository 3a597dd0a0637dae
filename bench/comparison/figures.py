"""What each headline benchmark prints, read back into figures.

The wrk runners (booking storm, slot reads, transfers, jobs) append one JSON
record per run to their ``--json`` file (benchlib.sweep); the scheduler and the
settlement runners print lines of text, read here by regular expressions that
also fit the releases before this one (their lines only grew at the end).
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass


@dataclass(frozen=True)
class Figure:
    """One figure of a benchmark; ``higher_is_better`` orients its ratio."""

    key: str
    label: str
    higher_is_better: bool


class UnreadableOutput(ValueError):
    """The output lacks a figure: the run failed, or its format changed."""


def _number(text: str) -> float:
    return float(text.replace(",", ""))


def wrk_run_figures(json_lines: str, rate_key: str) -> dict[str, float]:
    """The figures of one wrk runner's invocation with ``--runs 1``: its rate
    (``rate_key``), p99 latency and reservo's CPU per request. Several records
    (several configurations) are refused: compare.py runs exactly one."""
    records = [json.loads(line) for line in json_lines.splitlines() if line.strip()]
    if len(records) != 1:
        raise UnreadableOutput(f"expected one JSON record, found {len(records)}")
    record = records[0]
    try:
        figures = {"rate": float(record[rate_key]), "p99_ms": float(record["p99_ms"])}
    except KeyError as missing:
        raise UnreadableOutput(f"no {missing} in the JSON record") from None
    cpu = record.get("cpu", {}).get("cpu_ms_per_req_reservo")
    if cpu is not None:  # older runners did not measure it
        figures["cpu_ms_per_req"] = float(cpu)
    return figures


_DRAIN = re.compile(r"^drain: .*? ([\d,.]+) jobs/s overall", re.MULTILINE)
_FIRE = re.compile(r"^fire .*\[clean\].*? p99 ([\d.]+)", re.MULTILINE)


def scheduler_figures(stdout: str) -> dict[str, float]:
    """bench/scheduler/bench.py --phases drain,fire: the drain's rate (jobs/s from
    the workers' start) and the clean fire's p99 lateness (ms)."""
    drain, fire = _DRAIN.search(stdout), _FIRE.search(stdout)
    if drain is None or fire is None:
        raise UnreadableOutput("no 'drain: ... jobs/s overall' or no clean 'fire ... p99' line")
    return {"drain_per_s": _number(drain[1]), "lateness_p99_ms": _number(fire[1])}


_TOTAL = re.compile(r"^\s*total\s+([\d.]+) s\b", re.MULTILINE)
_UNSETTLED = re.compile(r"unsettled left: (\d+)")


def settlement_figures(stdout: str) -> dict[str, float]:
    """bench/settlement/run.py: seconds from the result until every bet is settled,
    paid and notified. A run that left a bet unsettled has no figure."""
    total, unsettled = _TOTAL.search(stdout), _UNSETTLED.search(stdout)
    if total is None:
        raise UnreadableOutput("no 'total ... s' line")
    if unsettled is not None and int(unsettled[1]):
        raise UnreadableOutput(f"{unsettled[1]} bets left unsettled")
    return {"total_s": _number(total[1])}
