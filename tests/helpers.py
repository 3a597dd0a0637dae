"""Small builders shared by the HTTP tests."""

from __future__ import annotations

import asyncio
import base64
import hashlib
import hmac
import uuid
from datetime import date, timedelta
from typing import Any

import asyncpg
import httpx
import orjson

from reservo.core.db import Database
from reservo.core.errors import DomainError
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


async def post_together(
    client: httpx.AsyncClient, path: str, calls: list[tuple[dict[str, Any], dict[str, str]]]
) -> list[httpx.Response]:
    """POST ``path`` once per (body, headers), all released at once (a barrier)."""
    gate = asyncio.Event()

    async def one(body: dict[str, Any], headers: dict[str, str]) -> httpx.Response:
        await gate.wait()
        return await client.post(path, json=body, headers=headers)

    tasks = [asyncio.create_task(one(b, h)) for b, h in calls]
    await asyncio.sleep(0.05)
    gate.set()
    return list(await asyncio.gather(*tasks))


async def assert_grouped(db: asyncpg.Connection, table: str, ids: list[int]) -> None:
    """The rows were written by fewer transactions than half their number (a
    group commit): without batching every row has its own xmin."""
    # The table name is the test's own constant, never input.
    transactions = await db.fetchval(
        f"SELECT count(DISTINCT xmin::text) FROM {table} WHERE id = ANY($1::bigint[])", ids
    )
    assert transactions < len(ids) / 2, transactions


async def assert_stored_and_replayed(
    client: httpx.AsyncClient,
    db: asyncpg.Connection,
    path: str,
    body: dict[str, Any],
    headers: dict[str, str],
    created: httpx.Response,
) -> None:
    """The request's Idempotency-Key stored exactly its 201, and a retry replays it (200)."""
    stored = await db.fetchrow(
        "SELECT status, response_status, response_body FROM idempotency_key"
        " WHERE endpoint = $1 AND key = $2",
        f"POST {path}",
        headers["Idempotency-Key"],
    )
    assert (stored["status"], stored["response_status"]) == ("DONE", 201)
    assert orjson.loads(stored["response_body"]) == created.json()
    again = await client.post(path, json=body, headers=headers)
    assert (again.status_code, again.json()) == (200, created.json())


def unreachable_database() -> Database:
    """A Database whose server is not there (nothing listens on port 1)."""
    return Database(
        "postgresql://postgres@127.0.0.1:1/postgres", connect_timeout=1, acquire_timeout=1
    )


def assert_all_unavailable(results: list[Any]) -> None:
    """Every request got 503 unavailable with a Retry-After (the database was down)."""
    for result in results:
        assert isinstance(result, DomainError), result
        assert (result.status, result.code) == (503, "unavailable")
        assert result.headers == {"Retry-After": "1"}
