"""How a run is shown: the rich tables `reservo verify` prints, and its JSON."""

from __future__ import annotations

import json

from rich.table import Table

from reservo.verify.domain import Report, describe


def summary(report: Report) -> Table:
    """One line per check: rows looked at, violations."""
    t = Table(title=f"reservo verify: {'every invariant holds' if report.ok else 'VIOLATIONS'}")
    t.add_column("check")
    t.add_column("module")
    t.add_column("rows checked", justify="right")
    t.add_column("violations", justify="right")
    for o in report.outcomes.values():
        style = "red" if o.violations else "green"
        t.add_row(o.check.name, o.check.module, f"{o.rows:,}", f"{o.violations:,}", style=style)
    return t


def findings(report: Report) -> Table:
    """Each finding kept: its check, the rows at fault, the values that break it."""
    t = Table(title="findings (the first of each check)")
    t.add_column("check")
    t.add_column("subject")
    t.add_column("ids")
    t.add_column("facts", overflow="fold")
    for o in report.outcomes.values():
        for f in o.findings:
            t.add_row(f.check, f.subject, ", ".join(map(str, f.ids)), describe(f))
    return t


def as_json(report: Report) -> str:
    return json.dumps(report.as_json(), indent=2, default=str)
