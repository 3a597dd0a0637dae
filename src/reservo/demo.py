"""Demo data for `reservo up --demo`: a few doctors with two weeks of slots."""

from __future__ import annotations

from datetime import time, timedelta

from reservo.appointments.domain import ScheduleRule
from reservo.bootstrap import Container

DOCTORS = [
    ("Dr. Ana Souza", "America/Sao_Paulo", "cardiology", 1),
    ("Dr. Bruno Lima", "Europe/Lisbon", "dermatology", 1),
    ("Vaccination room", "Asia/Ho_Chi_Minh", "vaccination", 10),
]


async def load(c: Container) -> list[int]:
    """Idempotent: doctors are created once (by name); schedules re-run harmlessly."""
    ids: list[int] = []
    today = c.clock.now().date()
    async with c.db.connection() as conn:
        existing = {r["name"]: r["id"] for r in await conn.fetch("SELECT id, name FROM doctor")}
    for name, tz, specialty, capacity in DOCTORS:
        doctor_id = existing.get(name)
        if doctor_id is None:
            doctor_id = (await c.appointments.create_doctor(name, tz, specialty))["id"]
        rule = ScheduleRule(
            today,
            today + timedelta(days=13),
            frozenset(range(1, 8)),
            time(8),
            time(18),
            15,
            capacity,
        )
        await c.appointments.create_schedule(doctor_id, rule)
        ids.append(doctor_id)
    return ids
