"""Appointment use cases. Each owns its transaction: claim, check, write, emit."""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from datetime import date, timedelta
from typing import Any
from zoneinfo import ZoneInfo

import asyncpg
import orjson
import structlog

from reservo.appointments import domain, events, repo
from reservo.appointments.domain import Appointment
from reservo.core import metrics
from reservo.core.cache import Cache
from reservo.core.clock import Clock
from reservo.core.db import Database
from reservo.core.errors import DomainError
from reservo.core.idempotency import Within
from reservo.core.outbox import emit
from reservo.core.ratelimit import RateLimiter
from reservo.scheduler import Job, Scheduler

log = structlog.get_logger(__name__)

# A reminder job runs this long before the slot starts (skipped when booked later).
REMINDER_JOB = "appointments.reminder"
REMINDER_LEAD = timedelta(hours=24)


@dataclass(frozen=True)
class Limits:
    booking_rate_limit: int = 5
    booking_rate_window_s: int = 10
    slots_cache_ttl_s: int = 3
    # Per-process copy of a slot list in front of Redis (0: none). A list is never
    # older than slots_cache_ttl_s after its database read either way; this bounds
    # how long another API process keeps showing it after a booking changed it.
    slots_local_ttl_s: float = 1.0
    slots_local_max_entries: int = 4096
    full_mark_ttl_s: int = 30
    # How long Redis remembers that an Idempotency-Key reached the database: as
    # long as the database keeps the key itself.
    key_memory_s: int = 24 * 3600


@dataclass(frozen=True, slots=True)
class SlotList:
    """A cached slot list: its JSON bytes, and its earliest start so a list
    whose slots are all still ahead is served as is (no parse, no dump)."""

    body: bytes
    first_start: str  # the earliest startAt (ISO, UTC), "" for an empty list

    @classmethod
    def parse(cls, raw: bytes) -> SlotList:
        wire = orjson.loads(raw)
        return cls(raw, min((s["startAt"] for s in wire), default=""))

    def body_after(self, now_iso: str) -> bytes:
        """The list without the slots that started by ``now_iso``."""
        if not self.first_start or self.first_start > now_iso:
            return self.body
        return orjson.dumps([s for s in orjson.loads(self.body) if s["startAt"] > now_iso])


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
    ) -> None:
        self.db, self.clock, self.cache, self.limiter = db, clock, cache, limiter
        self.scheduler = scheduler
        self.limits = limits
        self._zones: dict[int, ZoneInfo] = {}  # a doctor's zone never changes
        self._slot_lists = cache.local(limits.slots_local_ttl_s, limits.slots_local_max_entries)

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
            slots = domain.expand(rule, tz)
            created = await repo.insert_slots(
                conn,
                doctor_id,
                [s.start_at for s in slots],
                [s.end_at for s in slots],
                rule.capacity,
            )
        days = {domain.local_date(s.start_at, tz) for s in slots}
        await self.cache.delete(*(_slots_key(doctor_id, d) for d in days))
        return created, len(slots) - created

    async def list_slots(self, doctor_id: int, day: date) -> bytes:
        """The JSON list of a local date's future slots with room left, in the
        API's wire form (SlotOut, built by PostgreSQL); may be up to
        ``slots_cache_ttl_s`` stale. Served from the per-process copy, else Redis,
        else PostgreSQL, and cached as bytes at each layer."""
        key = _slots_key(doctor_id, day)

        async def fill() -> tuple[SlotList, float]:
            raw, life_s = await self.cache.get_bytes(key)
            if raw is not None:
                try:
                    return SlotList.parse(raw), life_s
                except orjson.JSONDecodeError:
                    log.warning("cache.corrupt_entry", key=key)  # a miss, not an outage
            async with self.db.connection() as conn:
                tz = await self._zone(conn, doctor_id)
                start, end = domain.day_bounds(day, tz)
                body, first = await repo.available_slots_json(
                    conn, doctor_id, start, end, self.clock.now()
                )
            fresh = SlotList(body, first.isoformat() if first is not None else "")
            ttl = self.limits.slots_cache_ttl_s
            await self.cache.set_bytes(key, fresh.body, ttl)
            return fresh, float(ttl)

        listed: SlotList = await self._slot_lists.get(key, fill)
        # The cache may hold slots that started since it was filled.
        return listed.body_after(self.clock.now().isoformat())

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
