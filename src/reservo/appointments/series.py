"""Series (0057): several slots booked for one patient in one transaction, all
or nothing, and the rest of a series cancelled at once.

A series locks all its slot rows in id order before it books any (as a
reschedule locks its two), then the daily-limit rows of its days in order, so
it never holds a slot row while it waits for another: a single booking racing
it on the same slots waits for it or it waits for the booking, never both. A
deadlock nobody foresaw is retried (appointments/deadlocks.py). Each
appointment's event goes through the outbox as a single booking's does."""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Sequence
from datetime import datetime
from typing import Any

import asyncpg

from reservo.appointments import domain, events, repo
from reservo.appointments.daily_limits import DailyLimits
from reservo.appointments.deadlocks import retrying_deadlocks
from reservo.appointments.domain import Appointment
from reservo.appointments.errors import CONSTRAINTS
from reservo.appointments.payments import Payments
from reservo.appointments.refusals import booking_refusal
from reservo.core.http.idempotency import Within
from reservo.core.kernel import metrics
from reservo.core.kernel.errors import DomainError
from reservo.core.messaging.outbox import emit

# The refusals a cancel of a series' appointment may meet: it started or its
# hold ended meanwhile, and it is simply not part of "the rest" any more.
_NOT_CANCELLABLE = ("slot_in_past", "not_held")


def _for_slot(refusal: DomainError, slot_id: int) -> DomainError:
    """The refusal of one slot as the series' answer: its code, and which slot."""
    return DomainError(refusal.code, f"slot {slot_id}: {refusal.detail}", extra={"slotId": slot_id})


class _Booked:
    """One appointment a series booked, with what the full mark needs."""

    def __init__(self, appt: Appointment, row: asyncpg.Record) -> None:
        self.appt = appt
        self.remaining: int = row["remaining"]
        self.first_hold_end: datetime | None = row["first_hold_end"]


class SeriesBookings(DailyLimits, Payments):
    # AppointmentService's: a series' appointment is cancelled as any other.
    cancel: Callable[[int], Awaitable[Appointment]]

    async def book_series(
        self,
        patient_id: int,
        slot_ids: Sequence[int],
        within: Within[domain.Series] | None = None,
        *,
        notice: bool = False,
    ) -> domain.Series:
        """Every slot of ``slot_ids`` booked for the patient, or none: the first
        refusal (in the request's order) is answered with its code and slotId,
        and nothing is booked. ``notice``: a patient's series, bound by each
        slot's minimum notice."""
        series, booked, jobs, freed = await retrying_deadlocks(
            lambda: self._book_series_once(patient_id, slot_ids, within, notice)
        )
        now = self.clock.now()
        metrics.BOOKINGS.labels("appointments").inc(len(booked))
        for b in booked:
            if b.remaining == 0:
                ends = [t for t in (b.first_hold_end, b.appt.hold_expires_at) if t is not None]
                seat_back = min(ends, default=None)
                await self._mark_full(
                    b.appt.slot_id, None if seat_back is None else (seat_back - now).total_seconds()
                )
        await self._dispatch(jobs)
        await self._seats_freed(freed)
        for b in booked:
            await self._invalidate(b.appt)
        return series

    async def _book_series_once(
        self,
        patient_id: int,
        slot_ids: Sequence[int],
        within: Within[domain.Series] | None,
        notice: bool,
    ) -> tuple[domain.Series, list[_Booked], list[Any], list[Appointment]]:
        now = self.clock.now()
        jobs: list[Any] = []
        freed: list[Appointment] = []
        booked: list[_Booked] = []
        async with self.db.transaction() as conn:
            locked = await repo.lock_slots_for_series(conn, sorted(set(slot_ids)))
            for slot_id in slot_ids:
                # Holds past their end of these slots or of the patient never
                # refuse the series: flipped first (their seats back). Before the
                # day rows: a booking holding another slot row may wait for one.
                freed += await self._expire_stale(conn, slot_id, patient_id, now)
            await self._lock_days(conn, locked, patient_id, now)
            series_id = await repo.insert_series(conn, patient_id, now)
            for slot_id in slot_ids:
                appt, row = await self._book_one(conn, slot_id, patient_id, now, notice)
                booked.append(_Booked(appt, row))
            appts = tuple(b.appt for b in booked)
            await repo.set_series(conn, series_id, [a.id for a in appts])
            for appt in appts:
                if appt.status == "HELD":
                    await emit(conn, events.HELD, events.key(appt), events.held_payload(appt), now)
                    jobs += await self._expire_later(conn, appt)
                else:
                    await emit(conn, events.BOOKED, events.key(appt), events.payload(appt), now)
                    await self._remind_later(conn, appt, now)
            in_time = tuple(sorted(appts, key=lambda a: (a.start_at, a.id)))
            series = domain.Series(series_id, patient_id, in_time)
            if within is not None:
                await within(conn, series)
        return series, booked, jobs, freed

    async def _lock_days(
        self,
        conn: asyncpg.Connection,
        slots: Sequence[asyncpg.Record],
        patient_id: int,
        now: datetime,
    ) -> None:
        """The daily-limit rows of the series' days, locked in order after its
        slots (two series of one patient never wait for each other's days)."""
        days: set[tuple[int, Any]] = set()
        for s in slots:
            if s["max_per_patient_day"] is not None:
                tz = await self._zone(conn, s["doctor_id"])
                days.add((s["doctor_id"], domain.local_date(s["start_at"], tz)))
        for doctor_id, day in sorted(days):
            await repo.lock_patient_day(conn, doctor_id, patient_id, day, now)

    async def _book_one(
        self,
        conn: asyncpg.Connection,
        slot_id: int,
        patient_id: int,
        now: datetime,
        notice: bool,
    ) -> tuple[Appointment, asyncpg.Record]:
        """One slot of the series, or its refusal (with its slotId)."""
        try:
            row = await repo.book(conn, slot_id, patient_id, now, notice)
        except (asyncpg.UniqueViolationError, asyncpg.ExclusionViolationError) as exc:
            # Two slots of the series overlap, or the patient holds one already.
            code, detail = CONSTRAINTS[exc.constraint_name or ""]
            raise _for_slot(DomainError(code, detail), slot_id) from None
        if row is None:
            refusal = await booking_refusal(conn, slot_id, patient_id, now, notice)
            raise _for_slot(refusal, slot_id)
        appt = Appointment.from_row(row)
        try:
            await self._within_daily_limit(conn, appt, row["max_per_patient_day"], now)
        except DomainError as refusal:
            raise _for_slot(refusal, slot_id) from None
        return appt, row

    # -- reading and cancelling a series ----------------------------------------------

    async def series_patient(self, series_id: int) -> int:
        """The series' patient; 404 series_not_found when there is none."""
        async with self.db.connection() as conn:
            patient_id = await repo.series_patient(conn, series_id)
        if patient_id is None:
            raise DomainError("series_not_found", f"no series {series_id}")
        return patient_id

    async def cancel_series(self, series_id: int) -> domain.Series:
        """Cancels the series' appointments that have not started (BOOKED, or
        HELD and live), each as DELETE /api/appointments/{id} does (its seat to
        the slot's waitlist, its event, its reminder dropped), one after the
        other: a retry after a failure cancels the rest. What has started, was
        cancelled or has expired stays as it is."""
        patient_id = await self.series_patient(series_id)
        for appt in (await self._series(series_id, patient_id)).appointments:
            if appt.status in ("BOOKED", "HELD") and appt.start_at > self.clock.now():
                try:
                    await self.cancel(appt.id)
                except DomainError as err:
                    if err.code not in _NOT_CANCELLABLE:
                        raise
        return await self._series(series_id, patient_id)

    async def _series(self, series_id: int, patient_id: int) -> domain.Series:
        async with self.db.connection() as conn:
            rows = await repo.series_appointments(conn, series_id)
        now = self.clock.now()
        return domain.Series(
            series_id, patient_id, tuple(Appointment.from_row(r).as_of(now) for r in rows)
        )
