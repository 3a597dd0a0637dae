"""Appointment use cases. Each owns its transaction: claim, check, write, emit."""

from __future__ import annotations

import hashlib
from collections.abc import Callable
from dataclasses import dataclass
from datetime import date, timedelta
from typing import Any
from zoneinfo import ZoneInfo

import asyncpg

from reservo.appointments import domain, events, repo
from reservo.appointments.domain import Appointment, OpenSlot
from reservo.core import metrics
from reservo.core.cache import Cache
from reservo.core.clock import Clock
from reservo.core.db import Database
from reservo.core.errors import DomainError
from reservo.core.idempotency import Within
from reservo.core.outbox import emit
from reservo.core.ratelimit import RateLimiter
from reservo.scheduler import Job, Scheduler

# A reminder job runs this long before the slot starts (skipped when booked later).
REMINDER_JOB = "appointments.reminder"
REMINDER_LEAD = timedelta(hours=24)


@dataclass(frozen=True)
class Limits:
    booking_rate_limit: int = 5
    booking_rate_window_s: int = 10
    slots_cache_ttl_s: int = 3
    full_mark_ttl_s: int = 30
    # How long Redis remembers that an Idempotency-Key reached the database: as
    # long as the database keeps the key itself.
    key_memory_s: int = 24 * 3600


def _slots_key(doctor_id: int, day: date) -> str:
    return f"slots:{{doctor:{doctor_id}}}:{day.isoformat()}"


def _full_key(slot_id: int) -> str:
    return f"full:{{slot:{slot_id}}}"


def _seen_key(request_key: str) -> str:
    digest = hashlib.blake2b(request_key.encode(), digest_size=12).hexdigest()
    return f"seen:{digest}"


class AppointmentService:
    def __init__(
        self,
        db: Database,
        clock: Clock,
        cache: Cache,
        limiter: RateLimiter,
        limits: Limits = Limits(),
        scheduler: Scheduler | None = None,
        window: domain.Window = domain.Window(),
    ) -> None:
        self.db, self.clock, self.cache, self.limiter = db, clock, cache, limiter
        self.scheduler = scheduler
        self.limits = limits
        self.window = window
        self._zones: dict[int, ZoneInfo] = {}  # a doctor's zone never changes

    # -- doctors and schedules -------------------------------------------------

    async def create_doctor(self, name: str, tz: str, specialty: str | None) -> dict[str, Any]:
        async with self.db.transaction() as conn:
            return repo.as_dict(await repo.insert_doctor(conn, name, tz, specialty))

    async def _zone(self, conn: asyncpg.Connection, doctor_id: int) -> ZoneInfo:
        tz = self._zones.get(doctor_id)
        if tz is None:
            doctor = await repo.get_doctor(conn, doctor_id)
            if doctor is None:
                raise DomainError("doctor_not_found", f"no doctor {doctor_id}")
            tz = self._zones[doctor_id] = domain.zone(doctor["timezone"])
        return tz

    async def create_schedule(self, doctor_id: int, rule: domain.ScheduleRule) -> tuple[int, int]:
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
        )
        return created, slots

    async def _forget_days(self, doctor_id: int, tz: ZoneInfo, slots: list[domain.Slot]) -> None:
        days = {domain.local_date(s.start_at, tz) for s in slots}
        if days:
            await self.cache.delete(*(_slots_key(doctor_id, d) for d in days))

    async def list_slots(
        self, doctor_id: int, day: date, shape: Callable[[OpenSlot], dict[str, Any]]
    ) -> list[dict[str, Any]]:
        """Future slots of a local date with room left, each as ``shape`` makes it
        (the API's wire form, cached as is); may be a few seconds stale."""
        key = _slots_key(doctor_id, day)
        cached = await self.cache.get_json(key)
        now = self.clock.now()
        if cached is None:
            async with self.db.connection() as conn:
                tz = await self._zone(conn, doctor_id)
                start, end = domain.day_bounds(day, tz)
                rows = await repo.available_slots(conn, doctor_id, start, end, now)
            cached = [shape(OpenSlot.from_row(r)) for r in rows]
            await self.cache.set_json(key, cached, self.limits.slots_cache_ttl_s)
        now_iso = now.isoformat()
        # The cache may hold slots that started since it was filled.
        return [s for s in cached if s["startAt"] > now_iso]

    # -- booking ---------------------------------------------------------------

    async def gate(self, patient_id: int, slot_id: int, request_key: str) -> bool:
        """The Redis filter in front of a booking, in one round trip. Raises 429 when
        the patient is over the rate limit. Returns True when the attempt may be
        refused as slot_full without touching the database: Redis marks the slot
        full and has never seen this request's Idempotency-Key (a retry of a request
        that reached the database must get its stored answer, so it goes on)."""
        decision, (full, seen) = await self.cache.hit_and_check(
            self.limiter,
            "book",
            patient_id,
            self.limits.booking_rate_limit,
            self.limits.booking_rate_window_s,
            _full_key(slot_id),
            _seen_key(request_key),
        )
        if not decision.allowed:
            metrics.CONFLICTS.labels("appointments", "rate_limited", "redis").inc()
            raise DomainError(
                "rate_limited",
                f"at most {self.limits.booking_rate_limit} booking attempts per "
                f"{self.limits.booking_rate_window_s} s",
                headers={"Retry-After": str(max(1, decision.retry_after_s))},
            )
        if full and not seen:
            metrics.CONFLICTS.labels("appointments", "slot_full", "redis").inc()
            return True
        return False

    async def remember_key(self, request_key: str) -> None:
        """Tell the Redis filter that this key reached the database. Both marks live
        in the same Redis, so losing Redis loses both and the database decides."""
        await self.cache.mark(_seen_key(request_key), self.limits.key_memory_s)

    async def book(
        self, slot_id: int, patient_id: int, within: Within[Appointment] | None = None
    ) -> Appointment:
        now = self.clock.now()
        try:
            async with self.db.transaction() as conn:
                row = await repo.book(conn, slot_id, patient_id, now)
                if row is None:
                    raise await self._refusal(conn, slot_id, patient_id, now)
                appt = Appointment.from_row(row)
                await emit(conn, events.BOOKED, f"appointment:{appt.id}", events.payload(appt), now)
                remind_at = appt.start_at - REMINDER_LEAD
                if self.scheduler is not None and remind_at > now:
                    # Same transaction: the booking and its reminder commit together.
                    job = await self.scheduler.enqueue(
                        REMINDER_JOB,
                        {"appointmentId": appt.id},
                        run_at=remind_at,
                        idempotency_key=f"appointment:{appt.id}",
                        conn=conn,
                    )
                    await repo.set_reminder_job(conn, appt.id, job.id)
                if within is not None:
                    await within(conn, appt)
        except DomainError as err:
            if err.code == "slot_full":  # after the rollback: no network call inside it
                await self.cache.mark(_full_key(slot_id), self.limits.full_mark_ttl_s)
            raise
        metrics.BOOKINGS.labels("appointments").inc()
        if row["remaining"] == 0:
            await self.cache.mark(_full_key(slot_id), self.limits.full_mark_ttl_s)
        await self._invalidate(appt)
        return appt

    async def _refusal(
        self, conn: asyncpg.Connection, slot_id: int, patient_id: int, now: Any
    ) -> DomainError:
        """Why the conditional booking matched no row, read in the same transaction."""
        state = await repo.slot_state(conn, slot_id, patient_id)
        if state is None:
            code, detail = "slot_not_found", f"no slot {slot_id}"
        elif state["mine"]:
            code, detail = "already_booked", "you already hold a booking in this slot"
        elif state["start_at"] <= now:
            code, detail = "slot_in_past", "this slot has already started"
        elif state["opens_at"] > now:
            code = "slot_not_open"
            detail = f"this slot opens for booking at {state['opens_at'].isoformat()}"
        else:
            code, detail = "slot_full", "this slot has no capacity left"
        metrics.CONFLICTS.labels("appointments", code, "database").inc()
        return DomainError(code, detail)

    async def _invalidate(self, appt: Appointment) -> None:
        """Best effort, after the commit: a durable booking must never be answered
        with an error (the list may be a few seconds stale anyway)."""
        tz = self._zones.get(appt.doctor_id)  # no pool checkout when known
        if tz is None:
            try:
                async with self.db.connection() as conn:
                    tz = await self._zone(conn, appt.doctor_id)
            except DomainError:
                return  # database unreachable: the cached list expires on its own
        await self.cache.delete(_slots_key(appt.doctor_id, domain.local_date(appt.start_at, tz)))

    # -- reading and cancelling ------------------------------------------------

    async def get(self, appointment_id: int) -> Appointment:
        async with self.db.connection() as conn:
            row = await repo.get_appointment(conn, appointment_id)
        if row is None:
            raise DomainError("appointment_not_found", f"no appointment {appointment_id}")
        return Appointment.from_row(row)

    async def cancel(self, appointment_id: int) -> Appointment:
        """Cancelling twice is fine: the second call changes nothing and frees nothing."""
        now = self.clock.now()
        async with self.db.transaction() as conn:
            row = await repo.cancel(conn, appointment_id, now)
            if row is not None:
                appt = Appointment.from_row(row)
                await emit(
                    conn, events.CANCELLED, f"appointment:{appt.id}", events.payload(appt), now
                )
                reminder = await repo.reminder_job_of(conn, appointment_id)
                if self.scheduler is not None and reminder is not None:
                    await self.scheduler.cancel(reminder, conn=conn)
        if row is None:
            current = await self.get(appointment_id)
            if current.status == "CANCELLED":
                return current
            metrics.CONFLICTS.labels("appointments", "slot_in_past", "database").inc()
            raise DomainError("slot_in_past", "an appointment that has started cannot be cancelled")
        metrics.CANCELLATIONS.labels("appointments").inc()
        await self.cache.clear_mark(_full_key(appt.slot_id))
        await self._invalidate(appt)
        return appt

    async def remind(self, job: Job) -> None:
        """Handler of the reminder job. Idempotent: a rerun (worker died) or a
        cancelled appointment sends nothing."""
        now = self.clock.now()
        async with self.db.transaction() as conn:
            row = await repo.mark_reminded(conn, int(job.payload["appointmentId"]), now)
            if row is not None:
                appt = Appointment.from_row(row)
                await emit(
                    conn, events.REMINDER, f"appointment:{appt.id}", events.payload(appt), now
                )
