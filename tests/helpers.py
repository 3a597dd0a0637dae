"""Small builders shared by the HTTP tests."""

from __future__ import annotations

import base64
import hashlib
import hmac
import uuid
from datetime import date, timedelta
from typing import Any

import httpx

from tests.conftest import JWT_SECRET, auth

ADMIN = auth("admin", 1)


async def make_doctor(client: httpx.AsyncClient, tz: str = "Europe/Lisbon") -> int:
    r = await client.post("/api/doctors", json={"name": "Dr. Test", "timezone": tz}, headers=ADMIN)
    assert r.status_code == 201, r.text
    return int(r.json()["id"])


async def make_slots(
    client: httpx.AsyncClient,
    *,
    capacity: int = 1,
    days_ahead: int = 2,
    start: str = "08:00",
    end: str = "09:00",
    minutes: int = 15,
    tz: str = "Europe/Lisbon",
) -> tuple[int, list[dict[str, Any]]]:
    doctor = await make_doctor(client, tz)
    day = date.today() + timedelta(days=days_ahead)
    r = await client.post(
        f"/api/doctors/{doctor}/schedules",
        headers=ADMIN,
        json={
            "from": day.isoformat(),
            "to": day.isoformat(),
            "weekdays": list(range(1, 8)),
            "startTime": start,
            "endTime": end,
            "slotMinutes": minutes,
            "capacity": capacity,
        },
    )
    assert r.status_code == 201, r.text
    slots = await client.get(
        f"/api/doctors/{doctor}/slots", params={"date": day.isoformat()}, headers=ADMIN
    )
    assert slots.status_code == 200, slots.text
    return doctor, slots.json()


def key() -> dict[str, str]:
    return {"Idempotency-Key": str(uuid.uuid4())}


async def book(
    client: httpx.AsyncClient, slot_id: int, patient_id: int, idem: str | None = None
) -> httpx.Response:
    headers = {**auth("patient", patient_id), "Idempotency-Key": idem or str(uuid.uuid4())}
    return await client.post(
        "/api/appointments", json={"slotId": slot_id, "patientId": patient_id}, headers=headers
    )


def _b64url(raw: bytes) -> str:
    return base64.urlsafe_b64encode(raw).rstrip(b"=").decode()


def forge_token(
    payload: str | bytes,
    header: str | bytes = '{"alg":"HS256","typ":"JWT"}',
    secret: str = JWT_SECRET,
) -> str:
    """An HS256 JWT over exactly these header/payload bytes, correctly signed: for
    claims no JSON encoder writes (NaN, Infinity, odd types) or odd headers."""
    head = header.encode() if isinstance(header, str) else header
    body = payload.encode() if isinstance(payload, str) else payload
    signing_input = f"{_b64url(head)}.{_b64url(body)}"
    mac = hmac.new(secret.encode(), signing_input.encode(), hashlib.sha256).digest()
    return f"{signing_input}.{_b64url(mac)}"
