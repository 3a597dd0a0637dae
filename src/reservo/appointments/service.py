"""Appointment use cases. Each owns its transaction: claim, check, write, emit."""

from __future__ import annotations

import dataclasses
import hashlib
from collections.abc import AsyncIterator, Sequence
from contextlib import asynccontextmanager
from dataclasses import dataclass
from datetime import UTC, date, datetime, timedelta
from functools import partial
from typing import Any
from zoneinfo import ZoneInfo

import asyncpg
import orjson
import structlog

from reservo.appointments import calendar, domain, events, repo
from reservo.appointments.domain import Appointment
from reservo.core import contacts, metrics
from reservo.core.cache import Cache
from reservo.core.clock import HOUR_S, Clock
from reservo.core.db import Database
from reservo.core.errors import DomainError
from reservo.core.idempotency import Within
from reservo.core.jobqueue import JobQueue
from reservo.core.outbox import emit
from reservo.core.poison import isolate
from reservo.core.ratelimit import RateLimiter
from reservo.core.reads import read_one
from reservo.core.schemas import ApiModel, Id
from reservo.core.transport.base import Event
from reservo.core.turns import Turns
from reservo.scheduler import Job

log = structlog.get_logger(__name__)

# A reminder job runs this long before the slot starts (skipped when booked later).
REMINDER_JOB = "appointments.reminder"
REMINDER_LEAD = timedelta(hours=24)


class ReminderJob(ApiModel):
    """Payload of a REMINDER_JOB: the appointment to remind of. Written, checked
    at the jobs API and read by the handler with this one model."""

    appointment_id: Id


# Repeating schedules one run of the "appointments" role extends per transaction.
SCHEDULE_BATCH = 50
# The `loop` label of reservo_poison_rows_total for that role.
SCHEDULES_LOOP = "appointments.schedules"
# The longest reason stored on a parked schedule.
PARK_REASON_MAX = 2000
# The start of every keyset walk of a patient's appointments.
_BEFORE_ALL = (datetime(1, 1, 1, tzinfo=UTC), 0)
_DEADLOCK_RETRIES = 3
# The gate's two counters, looked up once (``labels()`` locks on every call).
_RATE_LIMITED = metrics.CONFLICTS.labels("appointments", "rate_limited", "redis")
_FULL_BY_REDIS = metrics.CONFLICTS.labels("appointments", "slot_full", "redis")


@dataclass(frozen=True)
class Limits:
    booking_rate_limit: int = 5
    booking_rate_window_s: int = 10
    # How long a slot list read from the primary stays in Redis while nothing
    # changes it. Every booking, cancellation and schedule change drops it (at once
    # after its commit, and again through the outbox if the process died first),
    # and a read that raced a change is never stored, so this is only the bound
    # when both drops were lost, and the lists that open later are caught by
    # expiring at the next opening time.
    slots_cache_life_s: int = 60
    # A list read from a replica (which may lag behind a change already
    # invalidated) lives only this long in Redis.
    slots_cache_ttl_s: int = 3
    # Per-process copy of a slot list in front of Redis (0: none): how long
    # another API process keeps showing it after a booking changed it.
    slots_local_ttl_s: float = 1.0
    slots_local_max_entries: int = 4096
    full_mark_ttl_s: int = 30
    # How long Redis remembers that an Idempotency-Key reached the database: as
    # long as the database keeps the key itself.
    key_memory_s: int = 24 * HOUR_S


@dataclass(frozen=True, slots=True)
class SlotList:
    """A cached slot list: its JSON bytes, and its earliest start so a list
    whose slots are all still ahead is served as is (no parse, no dump)."""

    body: bytes
    first_start: str  # the earliest startAt (ISO, UTC), "" for an empty list

    @classmethod
    def parse(cls, raw: bytes) -> SlotList:
        """A list as ``available_slots_json`` wrote it: its slots are in start
        order, so the first ``startAt`` is the earliest and is found without
        parsing the list. Anything not in that shape raises ValueError."""
        if not (raw.startswith(b"[") and raw.endswith(b"]")):
            raise ValueError("not a slot list")
        at = raw.find(_START_AT)
        if at < 0:
            if raw != b"[]":
                raise ValueError("not a slot list")
            return cls(raw, "")
        begin = at + len(_START_AT)
        end = raw.find(b'"', begin)
        if end < 0:
            raise ValueError("not a slot list")
        return cls(raw, raw[begin:end].decode("ascii"))

    def body_after(self, now_iso: str) -> bytes:
        """The list without the slots that started by ``now_iso``."""
        if not self.first_start or self.first_start > now_iso:
            return self.body
        return orjson.dumps([s for s in orjson.loads(self.body) if s["startAt"] > now_iso])


_START_AT = b'"startAt":"'


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
        scheduler: JobQueue | None = None,
        window: domain.Window = domain.Window(),
        no_shows: domain.NoShowPolicy = domain.NoShowPolicy(),
    ) -> None:
        self.db, self.clock, self.cache, self.limiter = db, clock, cache, limiter
        self.scheduler = scheduler
        self.limits = limits
        self.window = window
        self.no_shows = no_shows
        self._zones: dict[int, ZoneInfo] = {}  # a doctor's zone never changes
        self._slot_lists = cache.local(limits.slots_local_ttl_s, limits.slots_local_max_entries)
        self._turns = Turns()

    # -- doctors and schedules -------------------------------------------------

    async def create_doctor(self, name: str, tz: str, specialty: str | None) -> domain.Doctor:
        async with self.db.transaction() as conn:
            return domain.Doctor.from_row(await repo.insert_doctor(conn, name, tz, specialty))

    async def _zone(self, conn: asyncpg.Connection, doctor_id: int) -> ZoneInfo:
        tz = self._zones.get(doctor_id)
        if tz is None:
            doctor = await repo.get_doctor(conn, doctor_id)
            if doctor is None:
                raise DomainError("doctor_not_found", f"no doctor {doctor_id}")
            try:
                tz = self._zones[doctor_id] = domain.zone(doctor["timezone"])
            except ValueError:
                # Stored before the zone rule: nothing can be computed in it
                # until an operator corrects the doctor's zone.
                raise DomainError(
                    "unknown_timezone",
                    f"doctor {doctor_id}'s time zone {doctor['timezone']!r} is not a "
                    "known IANA zone; it must be corrected first",
                ) from None
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
            rule.overbook_limit,
        )
        return created, slots

    async def _forget_days(self, doctor_id: int, tz: ZoneInfo, slots: list[domain.Slot]) -> None:
        days = {domain.local_date(s.start_at, tz) for s in slots}
        if days:
            await self.cache.bump(*(_slots_key(doctor_id, d) for d in days))

    async def list_slots(self, doctor_id: int, day: date) -> bytes:
        """The JSON list of a local date's future slots with room left, in the
        API's wire form (SlotOut, built by PostgreSQL); may be up to
        ``slots_cache_ttl_s`` stale. Served from the per-process copy, else Redis,
        else PostgreSQL, and cached as bytes at each layer."""
        key = _slots_key(doctor_id, day)

        async def fill() -> tuple[SlotList, float]:
            raw, life_s, generation = await self.cache.get_versioned(key)
            if raw is not None:
                try:
                    return SlotList.parse(raw), life_s
                except ValueError:  # UnicodeDecodeError too
                    log.warning("cache.corrupt_entry", key=key)  # a miss, not an outage

            now = self.clock.now()

            async def read(
                conn: asyncpg.Connection,
            ) -> tuple[bytes, datetime | None, datetime | None]:
                tz = await self._zone(conn, doctor_id)
                start, end = domain.day_bounds(day, tz)
                return await repo.available_slots_json(conn, doctor_id, start, end, now)

            # A replica may serve it (seconds stale, like the cache); one that has not
            # seen a new doctor yet is not trusted with its 404.
            body, first, next_open = await self.db.stale_read(read, recheck=("doctor_not_found",))
            fresh = SlotList(body, first.isoformat() if first is not None else "")
            life = self._slot_list_life(now, next_open)
            if generation is None or life <= 0:
                return fresh, 0.0  # Redis away, or the list changes now: keep nothing
            stored = await self.cache.set_if_unchanged(key, fresh.body, life, generation)
            # Not stored: a change bumped the key since the read began, so this
            # answer may predate it; serve it (as a read would) but keep nothing.
            return fresh, life if stored else 0.0

        listed: SlotList | None = self._slot_lists.peek(key)  # the hot path: no await
        if listed is None:
            listed = await self._slot_lists.get(key, fill)
        # The cache may hold slots that started since it was filled.
        return listed.body_after(self.clock.now().isoformat())

    def _slot_list_life(self, now: datetime, next_open: datetime | None) -> float:
        """How long a freshly read list may be kept: long from the primary (every
        change drops it), short from a replica (it may predate a dropped change),
        and never past the moment the day's next slot opens (the list grows then)."""
        replicas = self.db.replicas is not None
        life = float(self.limits.slots_cache_ttl_s if replicas else self.limits.slots_cache_life_s)
        if next_open is not None:
            life = min(life, (next_open - now).total_seconds())
        return life

    # -- booking ---------------------------------------------------------------

    async def admit(self, patient_id: int, slot_id: int, request_key: str) -> None:
        """The Redis filter in front of a booking, in one round trip; returns when
        the attempt may go on to the database. Raises 429 when the patient is over
        the rate limit, and 409 slot_full when Redis marks the slot full and has
        never seen this request's Idempotency-Key (a retry of a request that
        reached the database must get its stored answer, so it goes on). A
        refusal here created nothing and is not recorded: a retry with the same
        key is simply evaluated again. A retry of a key that reached the
        database (seen) is not counted against the limit: it replays its stored
        answer, or takes its own single turn, and never creates a second thing."""
        decision, (full, seen) = await self.cache.hit_and_check(
            self.limiter,
            "book",
            patient_id,
            self.limits.booking_rate_limit,
            self.limits.booking_rate_window_s,
            _full_key(slot_id),
            _seen_key(request_key),
            spare=2,
        )
        if not decision.allowed:
            _RATE_LIMITED.inc()
            raise DomainError(
                "rate_limited",
                f"at most {self.limits.booking_rate_limit} booking attempts per "
                f"{self.limits.booking_rate_window_s} s",
                headers={"Retry-After": str(max(1, decision.retry_after_s))},
            )
        if full and not seen:
            _FULL_BY_REDIS.inc()
            raise DomainError("slot_full", "this slot has no capacity left")

    @asynccontextmanager
    async def turn(self, slot_id: int, request_key: str) -> AsyncIterator[None]:
        """One booking attempt per slot at a time goes on to the database from this
        process; the others wait in line here instead of on the slot row's lock
        with a pool connection each. An attempt that waited checks the full mark
        again, as the gate did, since the attempt before it may have filled the
        slot: a full slot then refuses it (raises slot_full) without the database,
        unless its Idempotency-Key already reached the database."""
        async with self._turns.turn(slot_id) as waited:
            if waited:
                full, seen = await self.cache.marks(_full_key(slot_id), _seen_key(request_key))
                if full and not seen:
                    _FULL_BY_REDIS.inc()
                    raise DomainError("slot_full", "this slot has no capacity left")
            yield

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
                await emit(conn, events.BOOKED, events.key(appt), events.payload(appt), now)
                # Same transaction: the booking and its reminder commit together.
                await self._remind_later(conn, appt, now)
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
        """Why the conditional booking matched no row."""
        refusal = await _slot_refusal(
            conn, slot_id, patient_id, now, ("slot_full", "this slot has no capacity left")
        )
        metrics.CONFLICTS.labels("appointments", refusal.code, "database").inc()
        return refusal

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
                refusal = await _slot_refusal(
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
                raise await _no_show_refusal(conn, appointment_id, doctor_id, now)
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

    async def _invalidate(self, appt: Appointment) -> None:
        """Best effort, after the commit: a durable booking must never be answered
        with an error. What this misses, the outbox's consumer of the booking's
        event drops again (``slot_lists_changed``)."""
        feeds = calendar.feed_keys(appt.patient_id, appt.doctor_id)
        try:
            await self._drop_list(appt.doctor_id, appt.start_at, *feeds)
        except DomainError:
            return  # database unreachable for the doctor's zone: the consumer will

    async def _drop_list(self, doctor_id: int, start_at: datetime, *also: str) -> bool:
        """Drop the cached list of the doctor's local date of ``start_at`` (and the
        cached values ``also`` names: the calendar feeds the change is in, in the
        same round trip); False if Redis did not take it. Raises 503 if the
        doctor's zone is unknown here and the database unreachable."""
        tz = self._zones.get(doctor_id)  # no pool checkout when known
        if tz is None:
            async with self.db.connection() as conn:
                tz = await self._zone(conn, doctor_id)
        return await self.cache.bump(_slots_key(doctor_id, domain.local_date(start_at, tz)), *also)

    async def slot_lists_changed(self, event: Event) -> None:
        """Consumer of the module's own booking events: drops the lists (and the
        calendar feeds) they changed once more, durably. The request drops them
        right after its commit; a process that died in between did not, and this
        runs until Redis took it (a failure is transient: the event is retried)."""
        p = event.payload
        patient_id = int(p["patientId"])
        changed = [(int(p["doctorId"]), datetime.fromisoformat(p["startAt"]))]
        if event.topic == events.RESCHEDULED:
            old = await self.get(int(p["rescheduledFrom"]))
            changed.append((old.doctor_id, old.start_at))
        for doctor_id, start_at in changed:
            feeds = calendar.feed_keys(patient_id, doctor_id)
            if not await self._drop_list(doctor_id, start_at, *feeds):
                raise DomainError("unavailable", "Redis did not take a slot list's invalidation")

    # -- reading and cancelling ------------------------------------------------

    async def get(self, appointment_id: int) -> Appointment:
        row = await read_one(
            self.db,
            repo.get_appointment,
            appointment_id,
            "appointment_not_found",
            f"no appointment {appointment_id}",
        )
        return Appointment.from_row(row)

    async def cancel(self, appointment_id: int) -> Appointment:
        """Cancelling twice is fine: the second call changes nothing and frees nothing."""
        now = self.clock.now()
        async with self.db.transaction() as conn:
            row = await repo.cancel(conn, appointment_id, now)
            if row is not None:
                appt = Appointment.from_row(row)
                await emit(conn, events.CANCELLED, events.key(appt), events.payload(appt), now)
                reminder = await repo.reminder_job_of(conn, appointment_id)
                if self.scheduler is not None and reminder is not None:
                    await self.scheduler.cancel(reminder, conn=conn)
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
            metrics.CONFLICTS.labels("appointments", "slot_in_past", "database").inc()
            raise DomainError("slot_in_past", "an appointment that has started cannot be cancelled")
        metrics.CANCELLATIONS.labels("appointments").inc()
        if given is None and not appt.overbooked:  # else no ordinary seat is free now
            await self.cache.clear_mark(_full_key(appt.slot_id))
        await self._invalidate(appt)
        if given is not None:  # the waiting patient's calendar gained it
            await self._invalidate(given)
        return appt

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

    # -- second release: lists ----------------------------------------------------

    async def patient_appointments(
        self, patient_id: int, status: str | None, after: tuple[datetime, int] | None, limit: int
    ) -> list[Appointment]:
        """Soonest first, from the keyset position ``after`` (exclusive)."""
        async with self.db.connection() as conn:
            rows = await repo.patient_appointments(
                conn, patient_id, status, after or _BEFORE_ALL, limit
            )
        return [Appointment.from_row(r) for r in rows]

    async def agenda(self, doctor_id: int, day: date) -> list[domain.AgendaSlot]:
        """Every slot of the doctor's local date with its appointments (never cached:
        the doctor sees the truth)."""
        async with self.db.connection() as conn:
            tz = await self._zone(conn, doctor_id)
            start, end = domain.day_bounds(day, tz)
            slots = await repo.agenda_slots(conn, doctor_id, start, end)
            appts = await repo.agenda_appointments(conn, [s["id"] for s in slots])
        by_slot: dict[int, list[domain.AgendaEntry]] = {}
        for a in appts:
            by_slot.setdefault(a["slot_id"], []).append(
                domain.AgendaEntry(a["id"], a["patient_id"], a["status"], a["overbooked"])
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
        self, old: Appointment, slot_id: int, within: Within[Appointment] | None = None
    ) -> Appointment:
        """Book ``slot_id`` and cancel ``old`` in one transaction: both commit or
        neither. The old seat then goes to its slot's waitlist, in the same
        transaction. A deadlock the lock order did not foresee is retried."""
        if old.slot_id == slot_id:
            raise DomainError("already_booked", "this appointment is already in that slot")
        for attempt in range(_DEADLOCK_RETRIES):
            try:
                appt, freed = await self._reschedule_once(old, slot_id, within)
                break
            except asyncpg.exceptions.DeadlockDetectedError:
                if attempt == _DEADLOCK_RETRIES - 1:
                    raise DomainError(
                        "request_in_progress", "the slots are busy; try again"
                    ) from None
        metrics.BOOKINGS.labels("appointments").inc()
        if not old.overbooked:
            await self.cache.clear_mark(_full_key(old.slot_id))
        await self._invalidate(appt)
        await self._invalidate(old)
        if freed is not None:
            await self._invalidate(freed)
        return appt

    async def _reschedule_once(
        self, old: Appointment, slot_id: int, within: Within[Appointment] | None
    ) -> tuple[Appointment, Appointment | None]:
        now = self.clock.now()
        async with self.db.transaction() as conn:
            # Lock order, as everywhere: the appointment row, then slot rows by id.
            cancelled = await repo.cancel_for_reschedule(conn, old.id, now)
            if cancelled is None:
                raise await self._not_reschedulable(conn, old.id)
            await repo.lock_slots(conn, sorted({old.slot_id, slot_id}))
            await repo.release_seat(conn, old.slot_id, cancelled["overbooked"])
            row = await repo.book(conn, slot_id, old.patient_id, now)
            if row is None:
                raise await self._refusal(conn, slot_id, old.patient_id, now)
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
            await self._remind_later(conn, appt, now)
            freed = None
            if not cancelled["overbooked"]:  # only an ordinary seat goes to the waitlist
                freed = await self._give_seat_to_waitlist(conn, old.slot_id, now)
            if within is not None:
                await within(conn, appt)
        return appt, freed

    async def _not_reschedulable(
        self, conn: asyncpg.Connection, appointment_id: int
    ) -> DomainError:
        row = await repo.get_appointment(conn, appointment_id)
        if row is None:
            return DomainError("appointment_not_found", f"no appointment {appointment_id}")
        if row["status"] != "BOOKED":
            return DomainError("not_reschedulable", f"the appointment is {row['status']}")
        return DomainError("not_reschedulable", "the appointment has already started")

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

    # -- second release: waitlist -------------------------------------------------

    async def join_waitlist(
        self, slot_id: int, patient_id: int, within: Within[domain.Waiting] | None = None
    ) -> domain.Waiting:
        now = self.clock.now()
        async with self.db.transaction() as conn:
            row = await repo.join_waitlist(conn, slot_id, patient_id, now)
            if row is None:
                raise await _slot_refusal(
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

    # -- second release: repeating schedules ----------------------------------------

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
        is parked and the others go on (core.poison). Returns how many schedules
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

    # -- second release: contact -------------------------------------------------------

    async def set_contact(
        self, patient_id: int, email: str | None, phone: str | None
    ) -> contacts.Contact:
        async with self.db.transaction() as conn:
            return await contacts.put(conn, patient_id, email, phone, self.clock.now())


async def _slot_refusal(
    conn: asyncpg.Connection,
    slot_id: int,
    patient_id: int,
    now: Any,
    seats: tuple[str, str],
    doctor_id: int | None = None,
) -> DomainError:
    """Why a booking or a waitlist join on the slot wrote nothing, read in the same
    transaction; ``seats`` (code, detail) when only the seats stand in the way
    (the slot is full for a booking, has room left for the waitlist).
    ``doctor_id``: a doctor acting on the slot, for whom another doctor's slot
    does not exist (a 403 would tell which ids exist)."""
    state = await repo.slot_state(conn, slot_id, patient_id, now)
    if state is None or doctor_id not in (None, state["doctor_id"]):
        return DomainError("slot_not_found", f"no slot {slot_id}")
    if state["blocked_until"] is not None:
        return no_show_blocked(state["blocked_until"])
    if state["mine"]:
        return DomainError("already_booked", "you already hold a booking in this slot")
    if state["start_at"] <= now:
        return DomainError("slot_in_past", "this slot has already started")
    if state["opens_at"] > now:
        return DomainError(
            "slot_not_open", f"this slot opens for booking at {state['opens_at'].isoformat()}"
        )
    return DomainError(*seats)


def no_show_blocked(until: datetime) -> DomainError:
    return DomainError(
        "no_show_limit",
        "too many missed appointments: booking is blocked until "
        f"{until.astimezone(UTC).isoformat()} (an admin may lift it)",
    )


async def _no_show_refusal(
    conn: asyncpg.Connection, appointment_id: int, doctor_id: int | None, now: datetime
) -> DomainError:
    """Why marking a no-show changed nothing; another doctor's appointment does
    not exist for the caller."""
    row = await repo.get_appointment(conn, appointment_id)
    if row is None or doctor_id not in (None, row["doctor_id"]):
        return DomainError("appointment_not_found", f"no appointment {appointment_id}")
    if row["status"] != "BOOKED":
        return DomainError("not_booked", f"the appointment is {row['status']}")
    return DomainError(
        "not_started",
        f"the slot starts at {row['start_at'].astimezone(UTC).isoformat()}: "
        "a no-show is marked after the start",
    )
