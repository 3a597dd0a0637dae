"""Demo data for `reservo up --demo`: a few doctors with two weeks of slots, rental
cars, the sandbox payment gateway (never a default) so a hold can be paid by hand,
and a few upcoming matches to bet on."""

from __future__ import annotations

from datetime import UTC, datetime, time, timedelta

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


# Upcoming matches (home, away, kick-off in days from the load, at 19:00 UTC). Each
# load adds the ones of its day (external id demo-<date>-<n>), so a demo started
# again days later still lists matches to bet on.
MATCHES = [
    ("Lisbon Lions", "Porto Harbour", 1),
    ("Hanoi Dragons", "Saigon Stars", 2),
    ("Sao Paulo United", "Rio Athletic", 3),
    ("Lisbon Lions", "Hanoi Dragons", 7),
]
DEMO_ODDS = {
    "1X2": {"HOME": "2.10", "DRAW": "3.30", "AWAY": "3.40"},
    "TOTALS_2_5": {"OVER": "1.90", "UNDER": "1.90"},
    "BTTS": {"YES": "1.80", "NO": "2.00"},
}


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
    evening = datetime.combine(today, time(19), UTC)
    for n, (home, away, days) in enumerate(MATCHES, 1):
        try:
            await c.betting.create_match(
                f"demo-{today.isoformat()}-{n}",
                home,
                away,
                evening + timedelta(days=days),
                DEMO_ODDS,
            )
        except DomainError as exc:  # match_exists: loaded earlier today
            if exc.code != "match_exists":
                raise
    return ids
