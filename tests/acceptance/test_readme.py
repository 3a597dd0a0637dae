"""Every shell block of README.md, run with bash against `reservo up --demo` (what
`make demo` starts), twice: a reader who pastes a block again must not fail on
what the first run left behind.

Each section's blocks are one bash session under ``set -euo pipefail``: a command
that fails (a `json` helper that finds no such field, a `reservo token` that
exits 2) ends it. Every `curl` is recorded (tests/helpers/readme_blocks.py) and
must exit 0 and be answered below 400, except the refusals the README itself
announces, listed below with their reason. The answers the README's comments
promise are checked by field. A block that cannot run in a test is listed in
SKIPPED with its reason, and shows as skipped: none is ignored silently."""

from __future__ import annotations

import json
import re
from datetime import datetime
from pathlib import Path

import pytest

from tests.helpers.deployment import Deploy, Deployment
from tests.helpers.readme_blocks import Call, Run, run_session, sessions, shell_blocks

# A section whose blocks are not run: the start of its first line, and why.
SKIPPED = {
    "make demo": "`make demo` starts the service and blocks until Ctrl-C (the service it "
    "starts, `reservo up --demo`, is what every other block runs against); `make test` "
    "is this suite itself; `make test-fast` creates .venv and runs tests/unit",
}

# Refusals the README announces: (method, path pattern) -> (status, code, why).
ANNOUNCED = {
    ("POST", r"/api/appointments/\d+/no-show"): (
        409,
        "not_started",
        "the README: a no-show is marked once the slot has started, 409 not_started "
        "before; the evening slot it books is tomorrow's",
    ),
}

# The first line of a wallet statement (docs/OPERATIONS.md, "statement.csv").
STATEMENT_HEADER = "entry_id,created_at,kind,amount,balance_after,transfer_id,reference"


def _section_ids() -> list[object]:
    params: list[object] = []
    for section, blocks in sessions(shell_blocks()).items():
        first = blocks[0].text.lstrip()
        reason = next((why for start, why in SKIPPED.items() if first.startswith(start)), None)
        marks = (
            [pytest.mark.skip(reason=f"README line {blocks[0].line}: {reason}")] if reason else []
        )
        params.append(pytest.param(section, marks=marks, id=section or "top"))
    return params


def test_every_skip_names_a_block_of_the_readme() -> None:
    firsts = [b.text.lstrip() for b in shell_blocks()]
    for start in SKIPPED:
        assert any(first.startswith(start) for first in firsts), f"no README block starts {start!r}"


@pytest.fixture(scope="module")
async def demo(deploy: Deploy) -> Deployment:
    return await deploy("up", demo=True)


def _announced(call: Call) -> tuple[int, str, str] | None:
    for (method, pattern), refusal in ANNOUNCED.items():
        if call.method == method and re.fullmatch(pattern, call.path):
            return refusal
    return None


def _instant(text: str) -> datetime:
    return datetime.fromisoformat(text.replace("Z", "+00:00"))


def _promises(calls: list[Call]) -> None:
    """What the README's comments say the answers hold."""

    def by(method: str, pattern: str) -> list[Call]:
        return [c for c in calls if c.method == method and re.fullmatch(pattern, c.path)]

    for call in by("POST", "/api/appointments"):
        booked = call.json()
        assert call.status in (200, 201), call
        if "price" in booked:  # a prepaid slot: held until paid
            assert booked["status"] == "HELD" and booked["paymentUrl"], call
        else:
            assert booked["status"] == "BOOKED", call
        if '"overbook": true' in " ".join(call.args):
            assert booked["overbooked"] is True, call
    for call in by("GET", r"/api/appointments/\d+"):
        if "price" in call.json():  # the prepaid appointment, read after the sandbox paid it
            assert call.json()["status"] == "BOOKED", call
    for call in by("POST", r"/sandbox/pay-appointment/\d+"):  # the sandbox page pays
        assert "Gateway result: <b>confirmed" in call.body, call
    for call in by("GET", r"/calendars/[^/]+\.ics"):
        if "-o" in call.args:  # the conditional poll: 304 printed
            assert call.status == 304, call
        else:
            assert call.body.startswith("BEGIN:VCALENDAR"), call
    held = {c.json()["bookingId"]: c.json() for c in by("POST", "/api/bookings")}
    for call in by("POST", r"/api/bookings/\d+/extend-hold"):
        booking = call.json()
        assert booking["status"] == "HOLD", call
        before = _instant(held[booking["bookingId"]]["holdExpiresAt"])
        assert (_instant(booking["holdExpiresAt"]) - before).total_seconds() == 900, call
    paid = {}  # bookingId -> what its webhook paid beyond the deposit
    for call in by("POST", "/api/payments/webhook"):
        sent = json.loads(call.args[call.args.index("-d") + 1])
        assert call.json()["result"] == "overpaid", call
        paid[sent["bookingId"]] = sent["amount"] - held[sent["bookingId"]]["depositAmount"]
    for call in by("GET", r"/api/bookings/\d+"):
        booking = call.json()
        if booking["bookingId"] in paid:
            assert booking["status"] == "CONFIRMED", call
            assert booking["overpaidRefund"] == paid[booking["bookingId"]] > 0, call
    for call in by("POST", r"/api/bookings/\d+/cancel"):
        booking = call.json()
        # a HOLD cancelled refunds nothing; a confirmed booking its deposit (the excess
        # went back when it was paid)
        refund = booking["depositAmount"] if booking["bookingId"] in paid else 0
        assert (booking["status"], booking["refundAmount"]) == ("CANCELLED", refund), call
    for call in by("GET", r"/api/matches/\d+"):  # created after its result was reported
        match = call.json()
        assert match["result"]["status"] == "FINISHED", call
        assert match["settlement"]["status"] == "SETTLED", call
    for call in by("PUT", r"/api/patients/\d+/contact"):
        sent = json.loads(call.args[call.args.index("-d") + 1])
        assert call.json()["pushSubscriptions"] == sent.get("pushSubscriptions", []), call
    transfers = [c.json() for c in by("POST", "/api/transfers")]
    assert all(t["status"] == "PENDING" and t["expiresAt"] for t in transfers), transfers
    for call in by("GET", r"/api/accounts/\d+"):
        account = call.json()
        assert 0 <= account["available"] <= account["balance"], call
    for call in by("POST", r"/api/transfers/\d+/post"):
        assert call.json()["status"] == "POSTED", call
    for call in by("POST", r"/api/transfers/\d+/void"):
        assert call.json()["status"] == "VOIDED", call
    for call in by("POST", "/api/webhook-endpoints") + by(
        "POST", r"/api/webhook-endpoints/\d+/rotate-secret"
    ):
        assert call.json()["secret"].startswith("whsec_"), call
    _job_promises(by("POST", "/api/jobs"))
    for call in by("GET", "/metrics"):
        if "Accept: application/openmetrics-text" in call.args:
            assert call.body.endswith("# EOF\n"), call
    for call in by("HEAD", "/healthz"):
        assert re.search(
            r"^traceresponse: 00-[0-9a-f]{32}-[0-9a-f]{16}-0[01]", call.body, re.M | re.I
        ), call
    for call in by("GET", r"/api/accounts/\d+/statement\.csv"):
        assert call.status == 200, call
        assert call.body.splitlines()[0] == STATEMENT_HEADER, call
    moved = by("POST", r"/api/appointments/\d+/reschedule")
    for call in moved:
        assert call.json()["rescheduledFrom"] == int(call.path.split("/")[3]), call
    for call in by("POST", r"/api/slots/\d+/waitlist"):
        assert call.json()["position"] >= 1, call


def _job_promises(posted: list[Call]) -> None:
    """Two posts under one Idempotency-Key: one job, the second answer a replay; two
    posts of one uniqueKey: one job, the second "deduplicated"."""
    by_key: dict[str, list[Call]] = {}
    by_unique: dict[str, list[Call]] = {}
    for call in posted:
        keys = [a for a in call.args if a.startswith("Idempotency-Key: ")]
        if keys:
            by_key.setdefault(keys[0], []).append(call)
        body = json.loads(call.args[call.args.index("-d") + 1])
        if "uniqueKey" in body:
            by_unique.setdefault(body["uniqueKey"], []).append(call)
    for same in by_key.values():
        assert len({c.json()["jobId"] for c in same}) == 1, same
        assert sorted(c.status for c in same) == [200] * (len(same) - 1) + [201], same
    for same in by_unique.values():
        assert len({c.json()["jobId"] for c in same}) == 1, same
        assert all(c.json()["deduplicated"] for c in same[1:]), same


@pytest.mark.parametrize("section", _section_ids())
def test_a_readme_section_runs_twice(demo: Deployment, section: str, tmp_path: Path) -> None:
    blocks = sessions(shell_blocks())[section]
    for attempt in (1, 2):
        run: Run = run_session(blocks, demo.cwd, demo.port, tmp_path / f"calls-{attempt}")
        said = (
            f"run {attempt} of {section!r}:\nstdout (end):\n{run.process.stdout[-3000:]}"
            f"\nstderr:\n{run.process.stderr}"
        )
        assert run.process.returncode == 0, said
        assert run.calls, said
        for call in run.calls:
            assert call.exit == 0, f"{call}\n{said}"
            refusal = _announced(call)
            if refusal is None:
                assert 200 <= call.status < 400, f"{call}\n{said}"
            else:
                status, code, why = refusal
                assert (call.status, call.json()["code"]) == (status, code), f"{call} ({why})"
        _promises(run.calls)
