"""Appointment use cases. Each owns its transaction: claim, check, write, emit.

The service is put together from the module's concerns, one file each: the slot
lists (slots), the Redis gate (gate), doctors and schedules (schedules), the
waitlist (waitlist) and the reminder jobs (reminders); booking, overbooking,
no-shows, cancelling and rescheduling are here."""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from datetime import UTC, date, datetime
from typing import Any
from zoneinfo import ZoneInfo

import asyncpg
import structlog

from reservo.appointments import domain, events, repo
from reservo.appointments.change_feed import SlotChangeFeed
from reservo.appointments.deadlocks import retrying_deadlocks
from reservo.appointments.domain import Appointment, Limits
from reservo.appointments.gate_repair import KeyMarks
from reservo.appointments.payments import PaymentGateway
from reservo.appointments.refusals import (
    booking_refusal,
    no_show_refusal,
    not_reschedulable,
    slot_refusal,
)
from reservo.appointments.schedules import Schedules
from reservo.appointments.series import SeriesBookings
from reservo.appointments.slots import READ_LANES, READS_PER_STATEMENT
from reservo.appointments.waitlist import Waitlist
from reservo.core.aio.turns import Turns
from reservo.core.db.database import Database
from reservo.core.db.replicas import StaleReads
from reservo.core.http.batching import Batcher
from reservo.core.http.idempotency import IdempotencyStore, Within
from reservo.core.jobqueue import JobQueue
from reservo.core.kernel import metrics
from reservo.core.kernel.clock import Clock
from reservo.core.kernel.errors import DomainError
from reservo.core.messaging.outbox import emit
from reservo.core.redis.cache import Cache
from reservo.core.redis.ratelimit import RateLimiter
from reservo.notifications import contacts, subscriptions
from reservo.scheduler import AllowList

log = structlog.get_logger(__name__)

# The start of every keyset walk of a patient's appointments.
_BEFORE_ALL = (datetime(1, 1, 1, tzinfo=UTC), 0)


class SlotFull(DomainError):
    """409 slot_full, knowing when a held seat of the slot ends at the latest
    (None: no hold), which bounds the gate's full mark."""

    def __init__(self, seat_back_at: datetime | None) -> None:
        super().__init__("slot_full", "this slot has no capacity left")
        self.seat_back_at = seat_back_at


def _seconds_until(at: datetime | None, now: datetime) -> float | None:
    return None if at is None else (at - now).total_seconds()


class AppointmentService(Schedules, Waitlist, SeriesBookings):
    def __init__(
        self,
        db: Database,
        clock: Clock,
        cache: Cache,
        limiter: RateLimiter,
        limits: Limits = Limits(),
        scheduler: JobQueue | None = None,
        window: domain.Window = domain.Window(),
        no_shows: domain.NoShowPolicy = domain.NoShowPolicy(),
        *,
        stale: StaleReads,
        idempotency: IdempotencyStore,
        gateway: PaymentGateway | None = None,
        push_allow: AllowList = AllowList(),
        feed: SlotChangeFeed | None = None,
    ) -> None:
        self.db, self.clock, self.cache, self.limiter = db, clock, cache, limiter
        self.feed = feed  # what vouches for slot lists older than the staleness bound
        self.stale = stale
        self.scheduler = scheduler
        self.limits = limits
        self.window = window
        self.no_shows = no_shows
        self.gateway = gateway  # takes prepaid appointments' payments and refunds
        # Where a patient's Web Push endpoints may point (RESERVO_JOBS_HTTP_ALLOW).
        self.push_allow = push_allow
        self._zones: dict[int, ZoneInfo] = {}  # a doctor's zone never changes
        self._slot_lists = cache.local(limits.slots_local_ttl_s, limits.slots_local_max_entries)
        self._refreshing = set()
        self._list_reads = Batcher(
            self._read_lists, READS_PER_STATEMENT, READ_LANES, name="slot_list_reads"
        )
        self._turns = Turns()
        self.key_marks = KeyMarks(cache, idempotency, clock, limits.key_memory_s)

    # -- booking ---------------------------------------------------------------

    async def book(
        self,
        slot_id: int,
        patient_id: int,
        within: Within[Appointment] | None = None,
        *,
        notice: bool = False,
    ) -> Appointment:
        """A seat of the slot: BOOKED, or HELD until paid on a prepaid slot. A
        hold past its end never refuses anyone: when the booking would be
        refused, the holds past their end of this slot or patient are flipped
        EXPIRED (their seats back) and the booking tried again. ``notice``: a
        patient's booking, bound by the slot's minimum notice (409
        too_late_to_book). The slot's daily limit binds every booking (409
        daily_limit). Neither refusal marks the slot full in Redis: the slot
        has seats for other patients."""
        now = self.clock.now()
        try:
            try:
                booked = await self._book_once(slot_id, patient_id, within, now, (False, notice))
            except (asyncpg.UniqueViolationError, asyncpg.ExclusionViolationError):
                # Maybe a hold of this patient past its end, not flipped yet: the
                # aborted transaction is tried again once, those holds flipped first.
                booked = await self._book_once(slot_id, patient_id, within, now, (True, notice))
        except SlotFull as full:
            # After the rollback: no network call inside it.
            await self._mark_full(slot_id, _seconds_until(full.seat_back_at, now))
            raise
        appt, row, jobs, freed = booked
        metrics.BOOKINGS.labels("appointments").inc()
        if row["remaining"] == 0:
            ends = [t for t in (row["first_hold_end"], appt.hold_expires_at) if t is not None]
            await self._mark_full(slot_id, _seconds_until(min(ends, default=None), now))
        await self._dispatch(jobs)
        await self._seats_freed(freed)
        await self._invalidate(appt)
        return appt

    async def _book_once(
        self,
        slot_id: int,
        patient_id: int,
        within: Within[Appointment] | None,
        now: datetime,
        flip_notice: tuple[bool, bool],
    ) -> tuple[Appointment, asyncpg.Record, list[Any], list[Appointment]]:
        """``flip_notice``: flip the stale holds first; bound by the notice."""
        flip_first, notice = flip_notice
        jobs: list[Any] = []
        async with self.db.transaction() as conn:
            freed = await self._expire_stale(conn, slot_id, patient_id, now) if flip_first else []
            row = await repo.book(conn, slot_id, patient_id, now, notice)
            if row is None and not flip_first:
                freed = await self._expire_stale(conn, slot_id, patient_id, now)
                if freed:
                    row = await repo.book(conn, slot_id, patient_id, now, notice)
            if row is None:
                refusal = await booking_refusal(conn, slot_id, patient_id, now, notice)
                if refusal.code == "slot_full":
                    raise SlotFull(await repo.first_hold_end(conn, slot_id))
                raise refusal
            appt = Appointment.from_row(row)
            await self._within_daily_limit(conn, appt, row["max_per_patient_day"], now)
            if appt.status == "HELD":
                await emit(conn, events.HELD, events.key(appt), events.held_payload(appt), now)
                jobs = await self._expire_later(conn, appt)
            else:
                await emit(conn, events.BOOKED, events.key(appt), events.payload(appt), now)
                # Same transaction: the booking and its reminder commit together.
                await self._remind_later(conn, appt, now)
            if within is not None:
                await within(conn, appt)
        return appt, row, jobs, freed

    # -- third release: staff overbooking ------------------------------------------

    async def overbook(
        self,
        slot_id: int,
        patient_id: int,
        doctor_id: int | None,
        within: Within[Appointment] | None = None,
    ) -> Appointment:
        """A staff booking beyond the slot's capacity, up to its overbook limit:
        always an overbooked seat (never one of the ordinary seats patients book,
        even when some are free), so staff and patients never compete for a seat.
        ``doctor_id``: the calling doctor, who must be the slot's (None: an admin).
        The same window, past, overlap and no-show rules as a booking."""
        now = self.clock.now()
        async with self.db.transaction() as conn:
            row = await repo.overbook(conn, slot_id, patient_id, now, doctor_id)
            if row is None:
                refusal = await slot_refusal(
                    conn,
                    slot_id,
                    patient_id,
                    now,
                    ("overbook_limit", "this slot has no overbooking seat left"),
                    doctor_id,
                )
                metrics.CONFLICTS.labels("appointments", refusal.code, "database").inc()
                raise refusal
            appt = Appointment.from_row(row)
            await emit(conn, events.BOOKED, events.key(appt), events.payload(appt), now)
            await self._remind_later(conn, appt, now)
            if within is not None:
                await within(conn, appt)
        metrics.BOOKINGS.labels("appointments").inc()
        await self._invalidate(appt)  # the list shows overbookedCount
        return appt

    # -- third release: no-shows ---------------------------------------------------

    async def mark_no_show(self, appointment_id: int, doctor_id: int | None) -> Appointment:
        """BOOKED -> NO_SHOW after the slot's start, by the slot's doctor
        (``doctor_id``; None: an admin), and the no-show policy applied in the
        same transaction. Of a no-show and a cancel at once, one wins: both are
        conditional on BOOKED and the appointment row's lock orders them."""
        now = self.clock.now()
        async with self.db.transaction() as conn:
            row = await repo.mark_no_show(conn, appointment_id, doctor_id, now)
            if row is None:
                raise await no_show_refusal(conn, appointment_id, doctor_id, now)
            appt = Appointment.from_row(row)
            await emit(conn, events.NO_SHOW, events.key(appt), events.payload(appt), now)
            blocked_until = await self._apply_policy(conn, appt.patient_id, now)
        if blocked_until is not None:
            log.info("appointments_patient_blocked", patient=appt.patient_id, until=blocked_until)
        await self._invalidate(appt)  # the slot list's counters and the calendar feeds
        return appt

    async def _apply_policy(
        self, conn: asyncpg.Connection, patient_id: int, now: datetime
    ) -> datetime | None:
        """Blocks the patient when their counted no-shows reached the limit; the
        policy row is locked first, so no-shows marked at once count each other."""
        cleared_at = await repo.lock_patient_policy(conn, patient_id)
        return await repo.apply_no_show_policy(
            conn,
            patient_id,
            now - domain.NO_SHOW_WINDOW,
            (self.no_shows.limit, self.no_shows.block_days),
            cleared_at,
        )

    async def clear_no_shows(self, patient_id: int) -> None:
        """The admin's override: unblocked now, and the no-shows marked so far no
        longer count towards the next block."""
        async with self.db.transaction() as conn:
            await repo.clear_no_shows(conn, patient_id, self.clock.now())

    async def no_show_standing(self, patient_id: int) -> domain.NoShowStanding:
        async with self.db.connection() as conn:
            row = await repo.no_show_standing(conn, patient_id, self.clock.now())
        return domain.NoShowStanding(row["counted"], row["total"], row["blocked_until"])

    # -- cancelling ------------------------------------------------------------

    async def cancel(self, appointment_id: int) -> Appointment:
        """Cancelling twice is fine: the second call changes nothing and frees
        nothing. A live hold is cancelled like a booking (its seat freed, its
        expiry job dropped); one past its end is EXPIRED: 409 not_held."""
        now = self.clock.now()
        async with self.db.transaction() as conn:
            row = await repo.cancel(conn, appointment_id, now)
            if row is not None:
                appt = Appointment.from_row(row)
                await emit(conn, events.CANCELLED, events.key(appt), events.payload(appt), now)
                await self._drop_reminder(conn, appointment_id)
                if appt.price_amount is not None:
                    await self._drop_expiry(conn, appointment_id)
                # The freed seat goes to the slot's waitlist before this commits. A
                # statement of its own: it must see entries committed while the
                # cancel waited for the slot row's lock. An overbooked seat is
                # not one the waitlist waits for.
                given = None
                if not appt.overbooked:
                    given = await self._give_seat_to_waitlist(conn, appt.slot_id, now)
        if row is None:
            current = await self.get(appointment_id)
            if current.status == "CANCELLED":
                return current
            if current.status == "EXPIRED":
                await self.expire_hold(appointment_id)  # flips it if no job did yet
                metrics.CONFLICTS.labels("appointments", "not_held", "database").inc()
                raise DomainError("not_held", "the hold ended unpaid: the appointment is EXPIRED")
            metrics.CONFLICTS.labels("appointments", "slot_in_past", "database").inc()
            raise DomainError("slot_in_past", "an appointment that has started cannot be cancelled")
        metrics.CANCELLATIONS.labels("appointments").inc()
        if given is None and not appt.overbooked:  # else no ordinary seat is free now
            await self._clear_full(appt.slot_id)
        await self._invalidate(appt)
        if given is not None:  # the waiting patient's calendar gained it
            await self._invalidate(given)
        return appt

    # -- second release: lists ----------------------------------------------------

    async def patient_appointments(
        self, patient_id: int, status: str | None, after: tuple[datetime, int] | None, limit: int
    ) -> list[Appointment]:
        """Soonest first, from the keyset position ``after`` (exclusive)."""
        async with self.db.connection() as conn:
            now = self.clock.now()
            rows = await repo.patient_appointments(
                conn, patient_id, status, after or _BEFORE_ALL, limit, now
            )
        return [Appointment.from_row(r).as_of(now) for r in rows]

    async def agenda(self, doctor_id: int, day: date) -> list[domain.AgendaSlot]:
        """Every slot of the doctor's local date with its appointments (never cached:
        the doctor sees the truth)."""
        now = self.clock.now()
        async with self.db.connection() as conn:
            tz = await self._zone(conn, doctor_id)
            start, end = domain.day_bounds(day, tz)
            slots = await repo.agenda_slots(conn, doctor_id, start, end)
            appts = await repo.agenda_appointments(conn, [s["id"] for s in slots])
        by_slot: dict[int, list[domain.AgendaEntry]] = {}
        for a in appts:
            by_slot.setdefault(a["slot_id"], []).append(
                domain.AgendaEntry(
                    a["id"],
                    a["patient_id"],
                    domain.effective_status(a["status"], a["hold_expires_at"], now),
                    a["overbooked"],
                    a["hold_expires_at"] if a["status"] == "HELD" else None,
                )
            )
        return [
            domain.AgendaSlot(
                s["id"],
                s["doctor_id"],
                s["start_at"],
                s["end_at"],
                s["opens_at"],
                s["capacity"],
                s["booked_count"],
                s["overbook_limit"],
                s["overbooked_count"],
                tuple(by_slot.get(s["id"], ())),
            )
            for s in slots
        ]

    # -- second release: reschedule -----------------------------------------------

    async def reschedule(
        self,
        old: Appointment,
        slot_id: int,
        within: Within[Appointment] | None = None,
        *,
        notice: bool = False,
    ) -> Appointment:
        """Book ``slot_id`` and cancel ``old`` in one transaction: both commit or
        neither. The old seat then goes to its slot's waitlist, in the same
        transaction. A deadlock the lock order did not foresee is retried; one that
        comes back every time is 503 contention (passing: a retry runs again).
        ``notice``: a patient's move, bound by the new slot's minimum notice; the
        new slot's daily limit counts the day without the old appointment."""
        if old.slot_id == slot_id:
            raise DomainError("already_booked", "this appointment is already in that slot")
        appt, freed = await retrying_deadlocks(
            lambda: self._reschedule_once(old, slot_id, within, notice)
        )
        metrics.BOOKINGS.labels("appointments").inc()
        if not old.overbooked:
            await self._clear_full(old.slot_id)
        await self._invalidate(appt)
        await self._invalidate(old)
        if freed is not None:
            await self._invalidate(freed)
        return appt

    async def _reschedule_once(
        self, old: Appointment, slot_id: int, within: Within[Appointment] | None, notice: bool
    ) -> tuple[Appointment, Appointment | None]:
        now = self.clock.now()
        async with self.db.transaction() as conn:
            # Lock order, as everywhere: the appointment row, then slot rows by id.
            cancelled = await repo.cancel_for_reschedule(conn, old.id, now)
            if cancelled is None:
                raise await not_reschedulable(conn, old.id)
            await repo.lock_slots(conn, sorted({old.slot_id, slot_id}))
            await repo.release_seat(conn, old.slot_id, cancelled["overbooked"])
            row = await repo.book(conn, slot_id, old.patient_id, now, notice)
            if row is None:
                raise await booking_refusal(conn, slot_id, old.patient_id, now, notice)
            await self._within_daily_limit(
                conn, Appointment.from_row(row), row["max_per_patient_day"], now
            )
            lineage = await repo.set_rescheduled_from(conn, row["id"], old.id)
            appt = dataclasses.replace(
                Appointment.from_row(row), rescheduled_from=old.id, lineage_id=lineage
            )
            await emit(
                conn,
                events.RESCHEDULED,
                events.key(appt),
                events.rescheduled_payload(appt, old),
                now,
            )
            await self._drop_reminder(conn, old.id)
            if appt.status == "HELD":  # moved into a prepaid slot: paid there first
                await emit(conn, events.HELD, events.key(appt), events.held_payload(appt), now)
                await self._expire_later(conn, appt)  # durable; the scheduler loads it
            else:
                await self._remind_later(conn, appt, now)
            freed = None
            if not cancelled["overbooked"]:  # only an ordinary seat goes to the waitlist
                freed = await self._give_seat_to_waitlist(conn, old.slot_id, now)
            if within is not None:
                await within(conn, appt)
        return appt, freed

    # -- second release: contact -------------------------------------------------------

    async def set_contact(
        self,
        patient_id: int,
        email: str | None,
        phone: str | None,
        push: Sequence[subscriptions.PushSubscription] = (),
    ) -> contacts.Contact:
        """422 ``destination_not_allowed`` for a push endpoint the egress rules
        refuse (the keys' format is the request model's to check)."""
        for i, sub in enumerate(push):
            why = subscriptions.endpoint_problem(self.push_allow, sub.endpoint)
            if why is not None:
                raise DomainError("destination_not_allowed", f"pushSubscriptions[{i}]: {why}")
        async with self.db.transaction() as conn:
            return await contacts.put(conn, patient_id, email, phone, push, self.clock.now())
