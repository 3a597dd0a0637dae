"""The console's browser tests: the real app served by uvicorn on a free port, and signing in."""

from __future__ import annotations

import asyncio
import os
import shutil
import socket
import uuid
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from datetime import date, timedelta
from typing import Any

import httpx
import uvicorn

from reservo.app import create_app
from reservo.bootstrap import Container, build
from reservo.core.kernel.clock import OffsetClock
from reservo.settings import Settings
from tests.helpers.auth import ADMIN, auth, new_id, token

CHROMIUM_CANDIDATES = ("chromium", "chromium-browser")


def chromium_path() -> str | None:
    explicit = os.environ.get("RESERVO_TEST_CHROMIUM")
    if explicit:
        return explicit
    for name in CHROMIUM_CANDIDATES:
        found = shutil.which(name)
        if found:
            return found
    return None


@dataclass
class Live:
    url: str
    container: Container
    http: httpx.AsyncClient  # to the live server, no cookies kept
    doctors: list[int] = field(default_factory=list)  # the demo's, when loaded


async def serve(settings: Settings) -> AsyncIterator[Live]:
    container = build(settings, OffsetClock())
    app = create_app(container)
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind(("127.0.0.1", 0))
    port = sock.getsockname()[1]
    server = uvicorn.Server(uvicorn.Config(app, log_config=None, access_log=False, lifespan="on"))
    task = asyncio.create_task(server.serve(sockets=[sock]))
    while not server.started:
        if task.done():
            task.result()
        await asyncio.sleep(0.02)
    url = f"http://127.0.0.1:{port}"
    async with httpx.AsyncClient(base_url=url, follow_redirects=False, timeout=10) as http:
        yield Live(url, container, http)
    server.should_exit = True
    await task
    sock.close()


async def sign_in(page: Any, live: Live, role: str = "admin", sub: int = 1) -> None:
    await page.goto(f"{live.url}/console")
    await page.fill("#token", token(role, sub))
    await page.click("form[action='/console/sign-in'] button")
    await page.wait_for_load_state()


async def booked_slot(
    live: Live, doctor_name: str = "Dr. W", end_time: str = "09:30"
) -> tuple[int, date, int, int]:
    """(doctor, day, slot, appointment): a doctor whose one-seat slots run from
    09:00 to ``end_time`` two days ahead, the first of them booked through the API."""
    http = live.http
    doctor = await http.post(
        "/api/doctors", json={"name": doctor_name, "timezone": "UTC"}, headers=ADMIN
    )
    assert doctor.status_code == 201, doctor.text
    doctor_id = doctor.json()["id"]
    day = live.container.clock.now().date() + timedelta(days=2)
    schedule = await http.post(
        f"/api/doctors/{doctor_id}/schedules",
        headers=ADMIN,
        json={
            "from": day.isoformat(),
            "to": day.isoformat(),
            "weekdays": list(range(1, 8)),
            "startTime": "09:00",
            "endTime": end_time,
            "slotMinutes": 30,
            "capacity": 1,
        },
    )
    assert schedule.status_code == 201, schedule.text
    slots = await http.get(
        f"/api/doctors/{doctor_id}/slots", params={"date": day.isoformat()}, headers=ADMIN
    )
    assert slots.status_code == 200, slots.text
    slot_id = slots.json()[0]["id"]
    patient = new_id()
    r = await http.post(
        "/api/appointments",
        json={"slotId": slot_id, "patientId": patient},
        headers={**auth("patient", patient), "Idempotency-Key": str(uuid.uuid4())},
    )
    assert r.status_code == 201, r.text
    return doctor_id, day, slot_id, r.json()["id"]
