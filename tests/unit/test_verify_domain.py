"""The verify module's pure rules: which checks run, what a report keeps and
answers (no I/O: the checks themselves are tests/integration/test_verify.py)."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest

from reservo.verify import CHECKS, Report, select
from reservo.verify.domain import LEASE_CUTOFF, OUTBOX_CUTOFF, Limits, finding, parameters


def test_no_check_named_means_all_and_an_unknown_name_is_refused() -> None:
    assert select(None) == list(CHECKS)
    assert [c.name for c in select(["bet_payouts", "slot_capacity"])] == [
        "slot_capacity",
        "bet_payouts",
    ]
    with pytest.raises(ValueError, match=r"unknown check.*nope.*known: slot_capacity"):
        select(["nope"])


def test_every_check_has_a_unique_name_a_promise_and_a_remedy() -> None:
    names = [c.name for c in CHECKS]
    assert len(set(names)) == len(names)
    assert all(c.promise and c.remedy and c.parts for c in CHECKS)


def test_a_report_counts_every_finding_and_keeps_the_first_few() -> None:
    report = Report(CHECKS, sample=2)
    assert report.ok and report.exit_code == 0
    for i in range(5):
        report.add(finding("wallet_balance", f"wallet_account {i}", [i, None], {"balance": i}))
    report.saw("wallet_balance", 1000)
    assert not report.ok and report.exit_code == 1
    assert report.violations()["wallet_balance"] == 5
    assert report.violations()["slot_capacity"] == 0
    doc = report.as_json()
    [wallet] = [c for c in doc["checks"] if c["check"] == "wallet_balance"]
    assert wallet["violations"] == 5 and wallet["truncated"] and wallet["rowsChecked"] == 1000
    assert wallet["findings"] == [
        {"subject": "wallet_account 0", "ids": [0], "facts": {"balance": 0}},
        {"subject": "wallet_account 1", "ids": [1], "facts": {"balance": 1}},
    ]
    assert doc["violations"] == 5 and doc["ok"] is False


def test_the_cutoffs_leave_a_lease_and_a_grace() -> None:
    now = datetime(2026, 12, 7, 12, tzinfo=UTC)
    values = parameters(now, Limits(grace_s=300, lease_s=17))
    assert values[LEASE_CUTOFF] == now - timedelta(seconds=317)
    assert values[OUTBOX_CUTOFF] == now - timedelta(seconds=300)
