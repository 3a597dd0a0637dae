"""The waitlist of a full slot: joined and left by patients, and given the seat
a cancellation or a reschedule frees, in the freeing transaction."""

from __future__ import annotations

from typing import Any

import asyncpg

from reservo.appointments import domain, events, repo
from reservo.appointments.domain import Appointment
from reservo.appointments.holds import Holds
from reservo.appointments.refusals import slot_refusal
from reservo.appointments.reminders import Reminders
from reservo.core.http.idempotency import Within
from reservo.core.kernel import metrics
from reservo.core.kernel.errors import DomainError
from reservo.core.messaging.outbox import emit


class Waitlist(Holds, Reminders):
    async def join_waitlist(
        self, slot_id: int, patient_id: int, within: Within[domain.Waiting] | None = None
    ) -> domain.Waiting:
        now = self.clock.now()
        async with self.db.transaction() as conn:
            row = await repo.join_waitlist(conn, slot_id, patient_id, now)
            if row is None:
                raise await slot_refusal(
                    conn,
                    slot_id,
                    patient_id,
                    now,
                    ("slot_available", "this slot has room left: book it instead"),
                )
            position = await repo.waitlist_position(conn, slot_id, row["id"])
            waiting = domain.Waiting(slot_id, patient_id, position)
            if within is not None:
                await within(conn, waiting)
        return waiting

    async def leave_waitlist(self, slot_id: int, patient_id: int) -> None:
        async with self.db.transaction() as conn:
            if await repo.leave_waitlist(conn, slot_id, patient_id):
                return
            if not await repo.slot_exists(conn, slot_id):
                raise DomainError("slot_not_found", f"no slot {slot_id}")
        raise DomainError("not_waiting", f"patient {patient_id} is not waiting for slot {slot_id}")

    async def waitlist(self, slot_id: int, limit: int) -> list[domain.WaitlistEntry]:
        """Who waits for a seat of ``slot_id``, next first (at most ``limit``)."""
        async with self.db.connection() as conn:
            rows = await repo.waitlist_of_slot(conn, slot_id, limit)
            if not rows and not await repo.slot_exists(conn, slot_id):
                raise DomainError("slot_not_found", f"no slot {slot_id}")
        return [
            domain.WaitlistEntry(n, r["patient_id"], r["created_at"])
            for n, r in enumerate(rows, start=1)
        ]

    async def _give_seat_to_waitlist(
        self, conn: asyncpg.Connection, slot_id: int, now: Any
    ) -> Appointment | None:
        """A seat of ``slot_id`` was freed in this transaction (which holds the slot
        row's lock): book it for the first waiting patient still free at that time.
        One who became busy is skipped and told; one who booked the slot meanwhile
        just leaves the line. Returns the booking made, if any."""
        while (first := await repo.first_waiting(conn, slot_id, now)) is not None:
            if first["holds_it"]:
                await repo.drop_waiting(conn, first["id"])
                continue
            if not first["busy"] and not first["blocked"]:
                busy_since = False
                try:
                    async with conn.transaction():  # a savepoint: a refusal skips one
                        row = await repo.book(conn, slot_id, first["patient_id"], now)
                except (
                    asyncpg.exceptions.ExclusionViolationError,
                    asyncpg.exceptions.UniqueViolationError,
                ):
                    busy_since = True  # booked elsewhere since the check: skipped below
                if not busy_since:
                    if row is None:
                        return None  # no seat after all (started, or taken): the line waits
                    await repo.drop_waiting(conn, first["id"])
                    appt = Appointment.from_row(row)
                    await emit(
                        conn,
                        events.WAITLIST_BOOKED,
                        events.key(appt),
                        events.payload(appt),
                        now,
                    )
                    if appt.status == "HELD":  # a prepaid slot: the patient pays first
                        held = events.held_payload(appt)
                        await emit(conn, events.HELD, events.key(appt), held, now)
                        await self._expire_later(conn, appt)
                    else:
                        await self._remind_later(conn, appt, now)
                    metrics.BOOKINGS.labels("appointments").inc()
                    return appt
            await repo.drop_waiting(conn, first["id"])
            await emit(
                conn,
                events.WAITLIST_SKIPPED,
                events.waitlist_key(slot_id),
                {
                    **events.skipped_payload(
                        slot_id,
                        first["patient_id"],
                        first["doctor_id"],
                        first["start_at"],
                        first["end_at"],
                    ),
                    "reason": "no_show_limit" if first["blocked"] else "busy",
                },
                now,
            )
        return None
