"""Verify: the cross-row invariants every module promises, checked on the live
database (`reservo verify`, and the maintenance role on a schedule). The facade:
what the CLI and the console use."""

from reservo.verify.domain import CHECKS, DEFAULT_GRACE_S, Check, Finding, Limits, Report, select
from reservo.verify.report import as_json, findings, summary
from reservo.verify.runner import verify
from reservo.verify.status import Status, load

__all__ = [
    "CHECKS",
    "DEFAULT_GRACE_S",
    "Check",
    "Finding",
    "Limits",
    "Report",
    "Status",
    "as_json",
    "findings",
    "load",
    "select",
    "summary",
    "verify",
]
