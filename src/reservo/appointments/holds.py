"""Holds of prepaid slots (the HELD state): the expiry job enqueued with the
hold, dropped when it is paid or cancelled, and the flip of holds past their end
that a booking does before it gives up, so an expired hold never refuses anyone
even before its job ran."""

from __future__ import annotations

from datetime import datetime

import asyncpg

from reservo.appointments import events, repo
from reservo.appointments.domain import Appointment
from reservo.core.http.schemas import ApiModel, Id
from reservo.core.jobqueue import JobQueue
from reservo.core.messaging.outbox import emit

# The per-hold expiry job's category (run at the hold's end by the scheduler).
EXPIRE_HOLD = "appointments.expire-hold"


class ExpireHoldJob(ApiModel):
    """Payload of an EXPIRE_HOLD job: the hold to expire. Written, checked at the
    jobs API and read by the handler with this one model."""

    appointment_id: Id


def expiry_key(appointment_id: int) -> str:
    return f"appointment:{appointment_id}"


class Holds:
    scheduler: JobQueue | None

    async def _expire_later(self, conn: asyncpg.Connection, appt: Appointment) -> list[object]:
        """The hold's expiry job, in the hold's transaction (so it survives any
        restart); returned for the dispatch after commit. None without a scheduler:
        the sweeper and the effective status still end the hold."""
        if self.scheduler is None or appt.status != "HELD" or appt.hold_expires_at is None:
            return []
        job = await self.scheduler.enqueue(
            EXPIRE_HOLD,
            ExpireHoldJob(appointment_id=appt.id).wire(),
            run_at=appt.hold_expires_at,
            idempotency_key=expiry_key(appt.id),
            conn=conn,
        )
        return [job]

    async def _drop_expiry(self, conn: asyncpg.Connection, appointment_id: int) -> None:
        """A paid or cancelled hold has nothing left to expire."""
        if self.scheduler is not None:
            await self.scheduler.cancel_by_key(EXPIRE_HOLD, expiry_key(appointment_id), conn=conn)

    async def _expire_stale(
        self, conn: asyncpg.Connection, slot_id: int, patient_id: int, now: datetime
    ) -> list[Appointment]:
        """Flip the holds past their end of the slot or of the patient (their
        seats back, EXPIRED events written); what was flipped."""
        expired = [
            Appointment.from_row(r)
            for r in await repo.expire_holds_of(conn, slot_id, patient_id, now)
        ]
        for appt in expired:
            await emit(conn, events.EXPIRED, events.key(appt), events.held_payload(appt), now)
            await self._drop_expiry(conn, appt.id)
        return expired
