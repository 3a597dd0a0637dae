"""The daily limit of a schedule's slots (0057): a patient holds at most
``max_per_patient_day`` live appointments (BOOKED, or HELD not past its end)
with the doctor on one of the doctor's local days.

Checked in the booking's transaction after its conditional insert: the row of
(doctor, patient, day) in appointment_day_lock is locked, then the day's live
appointments counted (the new one included). The lock is taken after the slot
row's, and held to the commit, so of two bookings of one patient's day the
second counts the first once it committed. A refusal rolls the booking back."""

from __future__ import annotations

from datetime import datetime

import asyncpg

from reservo.appointments import domain, repo
from reservo.appointments.domain import Appointment
from reservo.appointments.refusals import daily_limit
from reservo.appointments.slots import SlotLists
from reservo.core.kernel import metrics


class DailyLimits(SlotLists):
    async def _within_daily_limit(
        self, conn: asyncpg.Connection, appt: Appointment, limit: int | None, now: datetime
    ) -> None:
        """Raises 409 daily_limit when ``appt``, just written in this transaction,
        is one more than ``limit`` (None: no limit) on its local day."""
        if limit is None:
            return
        tz = await self._zone(conn, appt.doctor_id)
        day = domain.local_date(appt.start_at, tz)
        await repo.lock_patient_day(conn, appt.doctor_id, appt.patient_id, day, now)
        held = await repo.count_patient_day(
            conn, appt.doctor_id, appt.patient_id, domain.day_bounds(day, tz), now
        )
        if held > limit:
            metrics.CONFLICTS.labels("appointments", "daily_limit", "database").inc()
            raise daily_limit(limit)
