"""Every fault scenario ends the way an operator would end an incident: with
``reservo verify`` (the installed command, read-only) clean on the healed
database. It checks the invariants from the rows alone, independently of what
the scenario's own history says."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

BIN = Path(sys.executable).with_name("reservo")


def assert_verified(database_url: str, *, timeout_s: float = 120) -> dict[str, object]:
    """Runs ``reservo verify --json`` on ``database_url``; fails with its findings
    unless it exits 0. Returns its report."""
    done = subprocess.run(
        [str(BIN), "verify", "--database-url", database_url, "--json"],
        capture_output=True,
        text=True,
        timeout=timeout_s,
        check=False,
    )
    assert done.returncode == 0, f"reservo verify: {done.returncode}: {done.stdout}{done.stderr}"
    report: dict[str, object] = json.loads(done.stdout)
    return report
