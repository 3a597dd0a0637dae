"""A client generated from the live OpenAPI document by the ecosystem's own tool
(`openapi-python-client`) has every operation, and drives a real `reservo api`
process through the README walkthrough (book, replay, cancel, reschedule,
waitlist), a rental hold paid by its signed webhook, a transfer and a bet, each
module answering one typed problem too."""

from __future__ import annotations

import hashlib
import hmac
import importlib
import json
import os
import re
import subprocess
import sys
import time
import uuid
from datetime import UTC, date, datetime, timedelta
from http import HTTPStatus
from pathlib import Path
from types import ModuleType
from typing import Any

import httpx
import pytest

from reservo.settings import Settings
from tests.helpers.auth import PAY_SECRET, new_id, token
from tests.helpers.procs import env_for, free_port, running, wait_http

pytest.importorskip("openapi_python_client", reason="the dev extra's openapi-python-client")


def _generate(spec: dict[str, Any], where: Path) -> Path:
    """The client package `openapi-python-client` makes of ``spec``, under ``where``."""
    path = where / "openapi.json"
    path.write_text(json.dumps(spec))
    out = where / "reservo_client"
    env = {**os.environ, "PATH": f"{Path(sys.executable).parent}:{os.environ['PATH']}"}
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "openapi_python_client",
            "generate",
            "--path",
            str(path),
            "--output-path",
            str(out),
            "--meta",
            "none",
        ],
        capture_output=True,
        text=True,
        timeout=120,
        env=env,
        cwd=where,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    # The generator says so when it leaves an operation or a model out.
    assert "Warning" not in result.stdout + result.stderr, result.stdout + result.stderr
    return out


def _snake(operation_id: str) -> str:
    return re.sub(r"(?<!^)(?=[A-Z])", "_", operation_id).lower()


class Generated:
    """The generated package, imported from where it was written."""

    def __init__(self, root: Path, base_url: str) -> None:
        sys.path.insert(0, str(root.parent))
        for name in [m for m in sys.modules if m.split(".")[0] == "reservo_client"]:
            del sys.modules[name]
        self.pkg = importlib.import_module("reservo_client")
        self.models = importlib.import_module("reservo_client.models")
        self.root, self.base_url = root, base_url

    def operations(self) -> set[str]:
        return {p.stem for p in (self.root / "api").glob("*/*.py") if p.stem != "__init__"}

    def op(self, tag: str, name: str) -> ModuleType:
        return importlib.import_module(f"reservo_client.api.{tag}.{name}")

    def client(self, role: str, sub: int) -> Any:
        return self.pkg.AuthenticatedClient(base_url=self.base_url, token=token(role, sub))

    def public(self) -> Any:
        return self.pkg.Client(base_url=self.base_url)

    def body(self, model: str, data: dict[str, Any]) -> Any:
        return getattr(self.models, model).from_dict(data)


def _ok(response: Any, status: int) -> Any:
    assert response.status_code == HTTPStatus(status), response.content
    return response.parsed


def _problem(g: Generated, response: Any, status: int, code: str) -> None:
    """A refusal parsed by the generated client into its typed Problem."""
    assert response.status_code == HTTPStatus(status), response.content
    assert isinstance(response.parsed, g.models.Problem), response.parsed
    assert response.parsed.code == code and response.parsed.status == status


@pytest.mark.timeout(180)
def test_a_generated_client_drives_every_module(base_settings: Settings, tmp_path: Path) -> None:
    started = time.monotonic()
    port = free_port()
    base = f"http://127.0.0.1:{port}"
    log = tmp_path / "api.log"
    with running(["api", "--port", str(port)], env_for(base_settings), log) as proc:
        wait_http(f"{base}/healthz", proc, log)
        spec = httpx.get(f"{base}/openapi.json").json()
        g = Generated(_generate(spec, tmp_path), base)
        ids = {_snake(op["operationId"]) for ops in spec["paths"].values() for op in ops.values()}
        assert ids == g.operations()
        _walkthrough(g)
        _rental(g)
        _money(g)
    assert time.monotonic() - started < 90


def _walkthrough(g: Generated) -> None:
    admin, appts = g.client("admin", 1), "appointments"
    doctor = _ok(
        g.op(appts, "create_doctor").sync_detailed(
            client=admin, body=g.body("DoctorIn", {"name": "Dr Gen", "timezone": "UTC"})
        ),
        201,
    )
    day = date.today() + timedelta(days=1)
    schedule = {
        "from": day.isoformat(),
        "to": day.isoformat(),
        "weekdays": [1, 2, 3, 4, 5, 6, 7],
        "startTime": "08:00",
        "endTime": "10:00",
        "slotMinutes": 30,
        "capacity": 1,
    }
    created = g.op(appts, "create_schedule").sync_detailed(
        doctor.id, client=admin, body=g.body("ScheduleIn", schedule)
    )
    _ok(created, 201)
    slots = _ok(
        g.op(appts, "list_doctor_slots").sync_detailed(doctor.id, client=admin, date=day), 200
    )
    first, second = slots[0].id, slots[1].id
    a, b = new_id(), new_id()
    pa, pb = g.client("patient", a), g.client("patient", b)
    book = g.op(appts, "book_appointment")
    key = f"gen-{uuid.uuid4()}"
    body = g.body("AppointmentIn", {"slotId": first, "patientId": a})
    booked = _ok(book.sync_detailed(client=pa, body=body, idempotency_key=key), 201)
    replay = _ok(book.sync_detailed(client=pa, body=body, idempotency_key=key), 200)
    assert replay.to_dict() == booked.to_dict()
    # The slot is full now: b waits for it.
    waiting = g.op(appts, "join_waitlist").sync_detailed(
        first, client=pb, body=g.body("WaitlistIn", {"patientId": b})
    )
    assert _ok(waiting, 201).position == 1
    # a moves to the next slot: the seat goes to b in the same transaction.
    moved = g.op(appts, "reschedule_appointment").sync_detailed(
        booked.id,
        client=pa,
        body=g.body("AppointmentRescheduleIn", {"slotId": second}),
        idempotency_key=f"gen-{uuid.uuid4()}",
    )
    moved_to = _ok(moved, 200)
    assert moved_to.rescheduled_from == booked.id
    mine = g.op(appts, "list_patient_appointments").sync_detailed(b, client=pb)
    assert [x.slot_id for x in _ok(mine, 200).items] == [first]
    cancelled = g.op(appts, "cancel_appointment").sync_detailed(moved_to.id, client=pa)
    assert _ok(cancelled, 200).status == "CANCELLED"
    missing = book.sync_detailed(
        client=pa,
        body=g.body("AppointmentIn", {"slotId": new_id(), "patientId": a}),
        idempotency_key=f"gen-{uuid.uuid4()}",
    )
    _problem(g, missing, 404, "slot_not_found")
    no_token = g.op(appts, "get_appointment").sync_detailed(booked.id, client=g.public())
    _problem(g, no_token, 401, "unauthenticated")


def _rental(g: Generated) -> None:
    admin, rentals = g.client("admin", 1), "rentals"
    host, customer = new_id(), new_id()
    car_in = {
        "plate": f"G-{uuid.uuid4().hex[:8]}",
        "model": "Generated",
        "city": "Lisbon",
        "dailyPrice": 10_000,
        "hostId": host,
    }
    car = _ok(
        g.op(rentals, "create_car").sync_detailed(client=admin, body=g.body("CarIn", car_in)), 201
    )
    start = (datetime.now(UTC) + timedelta(days=10)).replace(microsecond=0)
    hold_in = {
        "carId": car.id,
        "customerId": customer,
        "from": start.isoformat(),
        "to": (start + timedelta(days=2)).isoformat(),
    }
    hold = g.op(rentals, "hold_car").sync_detailed(
        client=g.client("customer", customer),
        body=g.body("BookingIn", hold_in),
        idempotency_key=f"gen-{uuid.uuid4()}",
    )
    booking = _ok(hold, 201)
    assert booking.status == "HOLD"
    paid = g.body(
        "WebhookIn",
        {
            "bookingId": booking.booking_id,
            "providerTxnId": f"txn-{uuid.uuid4().hex}",
            "amount": booking.deposit_amount,
            "status": "SUCCEEDED",
        },
    )
    # The signature covers the bytes the generated client sends (httpx's JSON).
    raw = httpx.Request("POST", g.base_url, json=paid.to_dict()).content
    t = str(int(time.time()))
    mac = hmac.new(PAY_SECRET.encode(), f"{t}.".encode() + raw, hashlib.sha256).hexdigest()
    result = g.op(rentals, "receive_payment").sync_detailed(
        client=g.public(), body=paid, x_signature=f"t={t},v1={mac}"
    )
    assert _ok(result, 200).result == "confirmed"
    seen = g.op(rentals, "get_booking").sync_detailed(booking.booking_id, client=admin)
    assert _ok(seen, 200).status == "CONFIRMED"
    gone = g.op(rentals, "get_booking").sync_detailed(new_id(), client=admin)
    _problem(g, gone, 404, "booking_not_found")


def _money(g: Generated) -> None:
    admin, owner = g.client("admin", 1), new_id()
    bettor = g.client("bettor", owner)
    account = g.op("wallet", "create_account")
    src, dst = (
        _ok(
            account.sync_detailed(
                client=admin, body=g.body("AccountIn", {"ownerId": owner, "currency": "EUR"})
            ),
            201,
        )
        for _ in range(2)
    )
    deposit = g.op("wallet", "deposit_to_account").sync_detailed(
        src.id,
        client=admin,
        body=g.body("DepositIn", {"amount": 10_000, "reference": f"gen-{uuid.uuid4()}"}),
        idempotency_key=f"gen-{uuid.uuid4()}",
    )
    _ok(deposit, 201)
    transfer = g.op("wallet", "create_transfer")

    def move(amount: int) -> Any:
        body = {"fromAccountId": src.id, "toAccountId": dst.id, "amount": amount}
        return transfer.sync_detailed(
            client=bettor,
            body=g.body("TransferIn", body),
            idempotency_key=f"gen-{uuid.uuid4()}",
        )

    assert _ok(move(1_000), 201).amount == 1_000
    _problem(g, move(10**9), 409, "insufficient_funds")
    odds = {
        "1X2": {"HOME": "1.80", "DRAW": "3.40", "AWAY": "4.20"},
        "TOTALS_2_5": {"OVER": "1.90", "UNDER": "1.90"},
        "BTTS": {"YES": "1.70", "NO": "2.10"},
    }
    match_in = {
        "externalId": f"gen-{uuid.uuid4()}",
        "home": "Home",
        "away": "Away",
        "startsAt": (datetime.now(UTC) + timedelta(days=3)).isoformat(),
        "odds": odds,
    }
    match = _ok(
        g.op("betting", "create_match").sync_detailed(
            client=admin, body=g.body("MatchIn", match_in)
        ),
        201,
    )
    bet_in = {
        "accountId": src.id,
        "stake": 500,
        "selections": [{"matchId": match.id, "market": "1X2", "pick": "HOME", "odds": "1.80"}],
    }
    bet = g.op("betting", "place_bet").sync_detailed(
        client=bettor, body=g.body("BetIn", bet_in), idempotency_key=f"gen-{uuid.uuid4()}"
    )
    placed = _ok(bet, 201)
    assert placed.status == "PENDING" and placed.potential_payout == 900
    _problem(
        g, g.op("betting", "get_bet").sync_detailed(new_id(), client=admin), 404, "bet_not_found"
    )
    service = g.client("service", 1)
    _problem(
        g, g.op("jobs", "get_job").sync_detailed(new_id(), client=service), 404, "job_not_found"
    )
    replay = g.op("operations", "replay_dead_letter").sync_detailed(new_id(), client=admin)
    _problem(g, replay, 404, "not_found")
