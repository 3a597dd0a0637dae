"""The public slot list: read (from the per-process copy, Redis, a replica or the
primary), cached as bytes, and dropped after every change that alters it."""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass
from datetime import date, datetime, timedelta
from zoneinfo import ZoneInfo

import asyncpg
import orjson
import structlog

from reservo.appointments import calendar, domain, events, repo
from reservo.appointments.change_feed import SlotChangeFeed
from reservo.appointments.domain import Appointment, Limits
from reservo.core.db.database import Database
from reservo.core.db.reads import read_one
from reservo.core.db.replicas import StaleReads
from reservo.core.http.batching import Batcher, Outcome
from reservo.core.kernel.clock import Clock
from reservo.core.kernel.errors import DomainError
from reservo.core.messaging.transport.base import Event
from reservo.core.redis.cache import Cache
from reservo.core.redis.local_cache import LocalCache

log = structlog.get_logger(__name__)

_START_AT = b'"startAt":"'
# Slot lists read in one statement at most, and such statements in flight per
# process (each holds a pool connection while it runs; the rest are the writes').
READS_PER_STATEMENT = 64
READ_LANES = 4


@dataclass(frozen=True, slots=True)
class ListRead:
    """A slot list as PostgreSQL built it at ``now``: its JSON, its earliest
    start and when its next slot opens (None: neither)."""

    body: bytes
    first: datetime | None
    next_open: datetime | None
    now: datetime


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


def _doctor_not_found(outcome: object) -> bool:
    return isinstance(outcome, DomainError) and outcome.code == "doctor_not_found"


def slots_key(doctor_id: int, day: date) -> str:
    return f"slots:{{doctor:{doctor_id}}}:{day.isoformat()}"


class SlotLists:
    """The slot list's reads and invalidations, and the doctors' zones they (and
    every use case on a doctor's local dates) compute in."""

    db: Database
    stale: StaleReads
    clock: Clock
    cache: Cache
    limits: Limits
    feed: SlotChangeFeed | None  # None: a list older than the bound is read again
    _zones: dict[int, ZoneInfo]  # a doctor's zone never changes
    _slot_lists: LocalCache[SlotList]
    _refreshing: set[asyncio.Task[None]]  # refreshes ahead under way
    _list_reads: Batcher[tuple[int, date], ListRead]  # over ``_read_lists``

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

    async def list_slots(self, doctor_id: int, day: date) -> bytes:
        """The JSON list of a local date's future slots with room left, in the
        API's wire form (SlotOut, built by PostgreSQL); may be up to
        ``slots_cache_ttl_s`` stale. Served from the per-process copy, else Redis,
        else PostgreSQL, and cached as bytes at each layer."""
        key = slots_key(doctor_id, day)
        listed: SlotList | None = self._slot_lists.peek(key)  # the hot path: no await
        if listed is None:
            listed = await self._slot_lists.get(key, lambda: self._fill(key, doctor_id, day))
        # The cache may hold slots that started since it was filled.
        return listed.body_after(self.clock.now().isoformat())

    async def _fill(self, key: str, doctor_id: int, day: date) -> tuple[SlotList, float]:
        """The list from Redis, else read and stored there; with how long the
        per-process copy may keep it. A list about to expire is read again
        ahead by the one reader (of any process) that takes its refresh lease,
        in the background: nobody waits, and a popular list costs one
        PostgreSQL read per life for the whole deployment instead of one per
        API process whose copy found it expired."""
        ahead_s = self.limits.slots_refresh_ahead_s
        if ahead_s > 0:
            raw, life_s, generation, refresh = await self.cache.get_versioned_refreshing(
                key, ahead_s
            )
        else:
            (raw, life_s, generation), refresh = await self.cache.get_versioned(key), False
        if raw is not None and self._current(doctor_id, life_s):
            try:
                listed = SlotList.parse(raw)
            except ValueError:  # UnicodeDecodeError too
                log.warning("cache.corrupt_entry", key=key)  # a miss, not an outage
            else:
                if refresh and generation is not None:
                    self._refresh_later(key, doctor_id, day, generation)
                # The copy expires as the refresh window opens, so that a read of
                # this process meets the window and may take the lease.
                return listed, life_s - ahead_s if life_s > ahead_s else life_s
        return await self._read_and_store(key, doctor_id, day, generation)

    def _refresh_later(self, key: str, doctor_id: int, day: date, generation: bytes) -> None:
        task = asyncio.create_task(self._refresh(key, doctor_id, day, generation))
        self._refreshing.add(task)  # a strong reference until it ends
        task.add_done_callback(self._refreshing.discard)

    async def _refresh(self, key: str, doctor_id: int, day: date, generation: bytes) -> None:
        try:
            await self._read_and_store(key, doctor_id, day, generation)
        except Exception:  # the list then expires and is read as a miss
            log.warning("slots.refresh_failed", key=key, exc_info=True)

    def _current(self, doctor_id: int, life_s: float) -> bool:
        """Whether a list found in Redis with ``life_s`` to live may be served
        as it is: it is young enough that even a change whose drops were lost
        shows within ``slots_stale_s`` (the per-process copy's second counted),
        or the change feed vouches that its doctor did not change since it was
        read. Its age is counted from the life it was stored with, which a
        replica's list or a day's next opening only shortens: an older age."""
        limits, feed = self.limits, self.feed
        if feed is not None:
            feed.want()  # from the first list this process serves
        fresh_s = limits.slots_stale_s - limits.slots_local_ttl_s
        age_s = limits.slots_cache_life_s - life_s
        if age_s <= fresh_s:
            return True
        if feed is None:
            return False
        read_at = self.clock.now() - timedelta(seconds=age_s)
        return feed.vouches(doctor_id, read_at, fresh_s)

    async def _read_and_store(
        self, key: str, doctor_id: int, day: date, generation: bytes | None
    ) -> tuple[SlotList, float]:
        """Read the list and store it in Redis unless ``generation`` (read before)
        was bumped since; with how long a copy may keep it."""
        began = time.monotonic()
        read = await self._list_reads.submit((doctor_id, day))
        fresh = SlotList(read.body, read.first.isoformat() if read.first is not None else "")
        # The life counts from the read's start: a change that committed while
        # it ran is shown after ``slots_cache_life_s`` at most, even if its drop
        # was lost.
        life = self._slot_list_life(read.now, read.next_open) - (time.monotonic() - began)
        if generation is None or life <= 0:
            return fresh, 0.0  # Redis away, or the list changes now: keep nothing
        stored = await self.cache.set_if_unchanged(key, fresh.body, life, generation)
        # Not stored: a change bumped the key since the read began, so this
        # answer may predate it; serve it (as a read would) but keep nothing.
        return fresh, life if stored else 0.0

    async def _read_lists(self, wanted: list[tuple[int, date]]) -> list[Outcome[ListRead]]:
        """The lists (doctor, local date) missed in one turn of this process,
        read in one statement (``Batcher``: under load, what is missed while
        the last statements run). A replica may serve them (seconds stale, like
        the cache); one that has not seen a new doctor yet is not trusted with
        its 404: the primary is asked again for those."""
        now = self.clock.now()
        try:
            outcomes = await self.stale.read(lambda conn: self._lists_from(conn, wanted, now))
            again = [n for n, o in enumerate(outcomes) if _doctor_not_found(o)]
            if again and self.stale.may_lag:
                asked = [wanted[n] for n in again]
                confirmed = await self.stale.recheck(lambda c: self._lists_from(c, asked, now))
                for n, outcome in zip(again, confirmed, strict=True):
                    outcomes[n] = outcome
        except DomainError as err:  # the database away (503): every list's answer
            return [err] * len(wanted)
        return outcomes

    async def _lists_from(
        self, conn: asyncpg.Connection, wanted: list[tuple[int, date]], now: datetime
    ) -> list[Outcome[ListRead]]:
        zones: list[ZoneInfo | DomainError] = []
        for doctor_id, _ in wanted:
            try:
                zones.append(await self._zone(conn, doctor_id))
            except DomainError as err:  # this list's answer, not the others'
                zones.append(err)
        asked = [
            (doctor_id, *domain.day_bounds(day, tz))
            for (doctor_id, day), tz in zip(wanted, zones, strict=True)
            if not isinstance(tz, DomainError)
        ]
        lists = iter(await repo.available_slots_json(conn, asked, now) if asked else ())
        return [tz if isinstance(tz, DomainError) else ListRead(*next(lists), now) for tz in zones]

    def _slot_list_life(self, now: datetime, next_open: datetime | None) -> float:
        """How long a freshly read list may be kept: long from the primary (every
        change drops it), short from a replica (it may predate a dropped change),
        and never past the moment the day's next slot opens (the list grows then)."""
        lags = self.stale.may_lag
        life = float(self.limits.slots_cache_ttl_s if lags else self.limits.slots_cache_life_s)
        if next_open is not None:
            life = min(life, (next_open - now).total_seconds())
        return life

    async def _forget_days(self, doctor_id: int, tz: ZoneInfo, slots: list[domain.Slot]) -> None:
        days = {domain.local_date(s.start_at, tz) for s in slots}
        if days:
            await self.cache.bump(*(slots_key(doctor_id, d) for d in days))

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
        return await self.cache.bump(slots_key(doctor_id, domain.local_date(start_at, tz)), *also)

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

    async def get(self, appointment_id: int) -> Appointment:
        row = await read_one(
            self.db,
            repo.get_appointment,
            appointment_id,
            "appointment_not_found",
            f"no appointment {appointment_id}",
        )
        # A hold past its end reads EXPIRED even before a job flipped it.
        return Appointment.from_row(row).as_of(self.clock.now())
