"""Doctors and their schedules: a rule's slots generated at once (a dated
schedule), or kept generated up to the booking horizon by the ``appointments``
worker role (a repeating schedule)."""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime, timedelta
from functools import partial
from typing import Any
from zoneinfo import ZoneInfo

import asyncpg
import structlog

from reservo.appointments import domain, repo
from reservo.appointments.slots import SlotLists
from reservo.core.messaging.poison import isolate

log = structlog.get_logger(__name__)

# Repeating schedules one run of the "appointments" role extends per transaction.
SCHEDULE_BATCH = 50
# The `loop` label of reservo_poison_rows_total for that role.
SCHEDULES_LOOP = "appointments.schedules"
# The longest reason stored on a parked schedule.
PARK_REASON_MAX = 2000


class Schedules(SlotLists):
    window: domain.Window

    async def create_doctor(self, name: str, tz: str, specialty: str | None) -> domain.Doctor:
        async with self.db.transaction() as conn:
            return domain.Doctor.from_row(await repo.insert_doctor(conn, name, tz, specialty))

    async def create_schedule(self, doctor_id: int, rule: domain.ScheduleRule) -> tuple[int, int]:
        """A dated schedule: the rule's slots generated now, in the doctor's zone.
        Returns (created, skipped)."""
        async with self.db.transaction() as conn:
            tz = await self._zone(conn, doctor_id)
            created, slots = await self._generate(conn, doctor_id, tz, rule)
        await self._forget_days(doctor_id, tz, slots)
        return created, len(slots) - created

    async def _generate(
        self, conn: asyncpg.Connection, doctor_id: int, tz: ZoneInfo, rule: domain.ScheduleRule
    ) -> tuple[int, list[domain.Slot]]:
        """Insert the rule's slots; one that exists or overlaps another slot of the
        doctor is skipped (the database decides, ex_doctor_slot_overlap)."""
        slots = domain.expand(rule, tz)
        created = await repo.insert_slots(
            conn,
            doctor_id,
            [s.start_at for s in slots],
            [s.end_at for s in slots],
            rule.capacity,
            [domain.opens_at(s.start_at, tz, self.window) for s in slots],
            rule.overbook_limit,
            None if rule.prepaid is None else rule.prepaid.columns(),
            rule.booking.columns(),
        )
        return created, slots

    async def create_repeating_schedule(
        self, doctor_id: int, rule: domain.ScheduleRule
    ) -> tuple[int, int, int]:
        """A schedule without an end date: stored, and its slots generated now up
        to the horizon; the ``appointments`` worker role keeps extending it.
        Returns (schedule id, created, skipped)."""
        now = self.clock.now()
        async with self.db.transaction() as conn:
            tz = await self._zone(conn, doctor_id)
            # Never back-fill the past: expansion starts today at the earliest.
            first = max(rule.start_date, domain.local_date(now, tz))
            row = await repo.insert_repeating_schedule(
                conn,
                doctor_id,
                (
                    rule.start_date,
                    sorted(rule.weekdays),
                    rule.start_time,
                    rule.end_time,
                    rule.slot_minutes,
                    rule.capacity,
                    rule.overbook_limit,
                ),
                None if rule.prepaid is None else rule.prepaid.columns(),
                rule.booking.columns(),
                first - timedelta(days=1),
                now,
            )
            created, slots = await self._extend(conn, domain.RepeatingSchedule.from_row(row), now)
        await self._forget_days(doctor_id, tz, slots)
        return row["id"], created, len(slots) - created

    async def _extend(
        self, conn: asyncpg.Connection, schedule: domain.RepeatingSchedule, now: Any
    ) -> tuple[int, list[domain.Slot]]:
        tz = schedule.zone()
        until = domain.horizon_end(now, tz, self.window)
        rule = schedule.next_range(until)
        if rule is None:
            return 0, []
        created, slots = await self._generate(conn, schedule.doctor_id, tz, rule)
        await repo.set_generated_until(conn, schedule.id, until)
        return created, slots

    async def extend_schedules(self) -> int:
        """One batch of the ``appointments`` role: repeating schedules not generated
        up to today + horizon yet get their next days. Idempotent and safe with any
        number of workers: each schedule is locked (SKIP LOCKED) by one of them, and
        a slot generated twice is skipped by the database. A schedule that cannot
        be extended even alone (its doctor's zone unknown, a value out of range)
        is parked and the others go on (core.messaging.poison). Returns how many schedules
        it claimed (a full batch means: run again at once)."""
        now = self.clock.now()
        # No zone is more than a day ahead of UTC: a bound the index can use.
        bound = now.date() + timedelta(days=self.window.horizon_days + 1)
        async with self.db.connection() as conn, conn.transaction():
            due = await repo.due_schedule_ids(
                conn, now, self.window.horizon_days, SCHEDULE_BATCH, bound
            )
            await isolate(
                due,
                partial(self._extend_claimed, conn, now),
                partial(self._park_schedule, conn, now),
                loop=SCHEDULES_LOOP,
            )
        if due:
            log.info("appointments_schedules_extended", schedules=len(due))
        return len(due)

    async def _extend_claimed(
        self, conn: asyncpg.Connection, now: datetime, ids: Sequence[int]
    ) -> list[int]:
        """Extends claimed schedules inside a savepoint, so a row error undoes
        only this attempt and the claim's locks stay held."""
        async with conn.transaction():
            rows = await repo.schedules_by_id(conn, ids, now)
            for row in rows:
                await self._extend(conn, domain.RepeatingSchedule.from_row(row), now)
        return [row["id"] for row in rows]

    async def _park_schedule(
        self, conn: asyncpg.Connection, now: datetime, schedule_id: int, exc: BaseException
    ) -> None:
        reason = f"parked by the {SCHEDULES_LOOP} loop: {exc!r}"[:PARK_REASON_MAX]
        await repo.park_schedule(conn, schedule_id, now, reason)
