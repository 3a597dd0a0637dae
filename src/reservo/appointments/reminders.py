"""Reminder jobs: one per booking, enqueued in its transaction, dropped with it,
and the handler that emits the reminder event."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import asyncpg

from reservo.appointments import events, repo
from reservo.appointments.domain import Appointment
from reservo.core.db.database import Database
from reservo.core.http.schemas import ApiModel, Id
from reservo.core.jobqueue import JobQueue
from reservo.core.kernel.clock import Clock
from reservo.core.messaging.outbox import emit
from reservo.scheduler import Job

# A reminder job runs this long before the slot starts (skipped when booked later).
REMINDER_JOB = "appointments.reminder"
REMINDER_LEAD = timedelta(hours=24)


class ReminderJob(ApiModel):
    """Payload of a REMINDER_JOB: the appointment to remind of. Written, checked
    at the jobs API and read by the handler with this one model."""

    appointment_id: Id


class Reminders:
    db: Database
    clock: Clock
    scheduler: JobQueue | None

    async def _remind_later(self, conn: asyncpg.Connection, appt: Appointment, now: Any) -> None:
        """The reminder job of a booking (booked, rescheduled or given a freed
        seat), in its transaction; none when it starts sooner than the lead."""
        remind_at = appt.start_at - REMINDER_LEAD
        if self.scheduler is not None and remind_at > now:
            job = await self.scheduler.enqueue(
                REMINDER_JOB,
                ReminderJob(appointment_id=appt.id).wire(),
                run_at=remind_at,
                idempotency_key=f"appointment:{appt.id}",
                conn=conn,
            )
            await repo.set_reminder_job(conn, appt.id, job.id)

    async def _drop_reminder(self, conn: asyncpg.Connection, appointment_id: int) -> None:
        reminder = await repo.reminder_job_of(conn, appointment_id)
        if self.scheduler is not None and reminder is not None:
            await self.scheduler.cancel(reminder, conn=conn)

    async def remind(self, job: Job) -> None:
        """Handler of the reminder job. Idempotent: a rerun (worker died) or a
        cancelled appointment sends nothing."""
        now = self.clock.now()
        async with self.db.transaction() as conn:
            appointment_id = ReminderJob.model_validate(job.payload).appointment_id
            row = await repo.mark_reminded(conn, appointment_id, now)
            if row is not None:
                appt = Appointment.from_row(row)
                await emit(conn, events.REMINDER, events.key(appt), events.payload(appt), now)
