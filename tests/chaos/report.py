"""The table of the chaos run: one row per scenario (faults injected, traffic seen,
time to drain) and one per check. Markdown, so it pastes into docs/CHAOS.md."""

from __future__ import annotations

import io
from dataclasses import dataclass

from rich import box
from rich.console import Console
from rich.table import Table


@dataclass
class Row:
    scenario: str
    faults: str
    accepted: int
    answered_503: int
    connection_errors: int
    server_errors: int
    drained_s: float
    checks: list[tuple[str, bool, str]]
    seconds: float


ROWS: list[Row] = []


def render() -> str:
    faults = Table(box=box.MARKDOWN, title=None)
    for col in (
        "scenario",
        "faults injected",
        "accepted",
        "503",
        "conn. errors",
        "5xx",
        "drained in",
        "checks",
        "took",
    ):
        faults.add_column(col)
    for r in ROWS:
        passed = sum(ok for _, ok, _ in r.checks)
        faults.add_row(
            r.scenario,
            r.faults,
            str(r.accepted),
            str(r.answered_503),
            str(r.connection_errors),
            str(r.server_errors),
            f"{r.drained_s:.1f} s",
            f"{passed}/{len(r.checks)} ok",
            f"{r.seconds:.0f} s",
        )
    checks = Table(box=box.MARKDOWN)
    checks.add_column("check (after every scenario)")
    checks.add_column("last result")
    checks.add_column("detail (last scenario)")
    if ROWS:
        for name, ok, detail in ROWS[-1].checks:
            checks.add_row(name, "ok" if ok else "FAILED", detail)
    out = io.StringIO()
    console = Console(file=out, width=2000, color_system=None, force_terminal=False)
    console.print(faults)
    console.print()
    console.print(checks)
    return out.getvalue()
