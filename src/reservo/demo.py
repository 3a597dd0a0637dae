"""Demo data for `reservo up --demo`: a few doctors with two weeks of slots, rental
cars, and the sandbox payment gateway (never a default) so a hold can be paid by hand."""

from __future__ import annotations

from datetime import time, timedelta

from reservo.appointments.domain import ScheduleRule
from reservo.bootstrap import Container
from reservo.core.errors import DomainError
from reservo.settings import Settings

DOCTORS = [
    ("Dr. Ana Souza", "America/Sao_Paulo", "cardiology", 1),
    ("Dr. Bruno Lima", "Europe/Lisbon", "dermatology", 1),
    ("Vaccination room", "Asia/Ho_Chi_Minh", "vaccination", 10),
]

# Rental cars (plate, model, city, daily price in cents, host id): book one with a
# customer token, then open its paymentUrl to pay on the sandbox page.
CARS = [
    ("DEMO-001", "Toyota Vios", "HN", 80_000, 2),
    ("DEMO-002", "VinFast VF8", "HN", 150_000, 2),
    ("DEMO-003", "Honda City", "HCM", 90_000, 3),
]


def settings_for_demo(settings: Settings) -> Settings:
    """The demo pays on the sandbox page, unless the environment chose a gateway."""
    if settings.rentals_payment_gateway is not None:
        return settings
    return settings.model_copy(update={"rentals_payment_gateway": "sandbox"})


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
    for plate, model, city, price, host in CARS:
        try:
            await c.rentals.create_car(plate, model, city, price, host)
        except DomainError as exc:  # plate_taken: loaded by an earlier run
            if exc.code != "plate_taken":
                raise
    return ids
