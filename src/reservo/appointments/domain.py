"""Pure rules of clinic scheduling: expanding local working hours into UTC slots.

No I/O here. Local times are expanded with the doctor's IANA zone per date, and
slots are stepped in absolute time between the day's local start and end, so a
DST change inside working hours yields a shorter (or longer) day, never a
duplicate or a missing instant."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, replace
from datetime import UTC, date, datetime, time, timedelta
from typing import Any, Literal
from zoneinfo import ZoneInfo

from reservo.core.db.rows import FromRow, build
from reservo.core.kernel import timezones
from reservo.core.kernel.payments import split_payment


@dataclass(frozen=True, slots=True)
class Doctor(FromRow):
    id: int
    name: str
    timezone: str  # IANA zone: the doctor's working hours are local times there
    specialty: str | None


@dataclass(frozen=True)
class Appointment(FromRow):
    """A booking of one place in a slot (what the use cases hand around)."""

    id: int
    slot_id: int
    patient_id: int
    doctor_id: int
    status: str  # HELD | BOOKED | CANCELLED | NO_SHOW | EXPIRED (as stored)
    start_at: datetime
    end_at: datetime
    created_at: datetime
    # Set on the appointment a reschedule created: the one it replaced.
    rescheduled_from: int | None = None
    # The first appointment of its reschedule chain (None: itself); its events'
    # key, so a whole chain stays in order on one partition.
    lineage_id: int | None = None
    # A staff booking beyond the slot's capacity (counted in overbooked_count).
    overbooked: bool = False
    # A prepaid slot's seat (0054): HELD until paid, EXPIRED at hold_expires_at.
    hold_expires_at: datetime | None = None
    price_amount: int | None = None
    price_currency: str | None = None
    # The excess of the payment that confirmed it, refunded (0: paid exactly).
    overpaid_refund: int | None = None

    def effective_status(self, now: datetime) -> str:
        """What the appointment is at ``now``: a hold past its end is EXPIRED even
        before a job flipped it (it blocks no seat then either)."""
        return effective_status(self.status, self.hold_expires_at, now)

    def as_of(self, now: datetime) -> Appointment:
        """As a reader sees it at ``now`` (a hold past its end shows EXPIRED)."""
        status = self.effective_status(now)
        return self if status == self.status else replace(self, status=status)


def effective_status(status: str, hold_expires_at: datetime | None, now: datetime) -> str:
    if status == "HELD" and hold_expires_at is not None and hold_expires_at <= now:
        return "EXPIRED"
    return status


@dataclass(frozen=True)
class Prepaid:
    """A schedule's price, paid before a seat is confirmed: its slots are booked
    HELD for ``hold_minutes``, then BOOKED by the payment or EXPIRED."""

    amount: int  # minor units, > 0
    currency: str  # ISO 4217
    hold_minutes: int = 15

    def columns(self) -> tuple[int, str, int]:
        return self.amount, self.currency, self.hold_minutes


@dataclass(frozen=True)
class BookingRules:
    """A schedule's limits on patients' bookings, copied onto its slots.
    ``min_notice_minutes``: a patient books (or reschedules into) a slot only
    that long before its start, by the server's clock; staff are not bound.
    ``max_per_patient_day``: live appointments (BOOKED or HELD) a patient may
    hold with the doctor on one of the doctor's local days (None: no limit)."""

    min_notice_minutes: int = 0
    max_per_patient_day: int | None = None

    def columns(self) -> tuple[int, int | None]:
        return self.min_notice_minutes, self.max_per_patient_day


def too_late(start_at: datetime, now: datetime, min_notice_minutes: int) -> bool:
    """Whether a slot starting at ``start_at`` is within the notice at ``now``."""
    return start_at < now + timedelta(minutes=min_notice_minutes)


@dataclass(frozen=True)
class ScheduleRule:
    start_date: date
    end_date: date
    weekdays: frozenset[int]  # ISO: 1 = Monday .. 7 = Sunday
    start_time: time
    end_time: time
    slot_minutes: int
    capacity: int
    # Seats staff may book beyond capacity (POST /api/appointments with overbook).
    overbook_limit: int = 0
    # None: booked at once; else the slots are paid before confirmed.
    prepaid: Prepaid | None = None
    booking: BookingRules = BookingRules()


@dataclass(frozen=True)
class Slot:
    start_at: datetime
    end_at: datetime


def zone(name: str) -> ZoneInfo:
    """The doctor's zone by the one rule of every zone (core.kernel.timezones):
    UnknownZone (a ValueError) for a name it refuses."""
    return timezones.zone(name)


def local_instant(day: date, at: time, tz: ZoneInfo) -> datetime:
    """The UTC instant of a local wall-clock time. A time skipped by a DST jump
    maps forward (02:30 on a spring-forward night is 03:30); a repeated one
    takes its first occurrence."""
    return datetime.combine(day, at, tzinfo=tz).astimezone(UTC)


def day_bounds(day: date, tz: ZoneInfo) -> tuple[datetime, datetime]:
    """[start, end) of a local date in UTC (23 or 25 hours long on DST days)."""
    return local_instant(day, time(0), tz), local_instant(day + timedelta(days=1), time(0), tz)


def expand(rule: ScheduleRule, tz: ZoneInfo) -> list[Slot]:
    step = timedelta(minutes=rule.slot_minutes)
    slots: list[Slot] = []
    day = rule.start_date
    while day <= rule.end_date:
        if day.isoweekday() in rule.weekdays:
            start = local_instant(day, rule.start_time, tz)
            end = local_instant(day, rule.end_time, tz)
            # A date a zone skipped (Samoa, 30 Dec 2011) maps onto the next day's
            # instants; expanding it would duplicate that day's slots.
            at = start if local_date(start, tz) == day else end
            while at + step <= end:
                slots.append(Slot(at, at + step))
                at += step
        day += timedelta(days=1)
    return slots


def local_date(instant: datetime, tz: ZoneInfo) -> date:
    return instant.astimezone(tz).date()


@dataclass(frozen=True)
class Window:
    """The booking window: a slot opens at ``opening_time`` (the doctor's local
    time) of the day ``horizon_days`` before the slot's local date."""

    horizon_days: int = 14
    opening_time: time = time(7)


@dataclass(frozen=True)
class Limits:
    """The Redis side of booking: the gate's rate limit and marks, and how
    long slot lists are cached."""

    booking_rate_limit: int = 5
    booking_rate_window_s: int = 10
    # How long a slot list read from the primary stays in Redis while nothing
    # changes it. Every booking, cancellation and move drops it (at once after
    # its commit, and again through the outbox if the process died first), a
    # schedule change after its commit, and a read that raced a change is never
    # stored; the lists that open later expire at the next opening time.
    slots_cache_life_s: int = 60
    # The staleness bound when both drops of a change were lost (the design's
    # 3-5 s): a list older than this less the per-process copy's life is served
    # only while the change feed (change_feed.py) vouches for it.
    slots_stale_s: float = 5.0
    # A list read from a replica (which may lag behind a change already
    # invalidated) lives only this long in Redis.
    slots_cache_ttl_s: int = 3
    # A cached list with this long to live or less is read again ahead, in the
    # background, by one reader of the whole deployment (a Redis lease), while
    # the others keep serving it (0: none; each process then reads it again
    # when it expires).
    slots_refresh_ahead_s: float = 1.0
    # Per-process copy of a slot list in front of Redis (0: none): how long
    # another API process keeps showing it after a booking changed it.
    slots_local_ttl_s: float = 1.0
    slots_local_max_entries: int = 4096
    full_mark_ttl_s: int = 30
    # How long Redis remembers that an Idempotency-Key reached the database: as
    # long as the database keeps the key itself.
    key_memory_s: int = 24 * 60 * 60


def opens_at(start_at: datetime, tz: ZoneInfo, window: Window) -> datetime:
    day = local_date(start_at, tz) - timedelta(days=window.horizon_days)
    return local_instant(day, window.opening_time, tz)


def horizon_end(now: datetime, tz: ZoneInfo, window: Window) -> date:
    """The last local date whose slots may open today: what a repeating schedule
    keeps generated."""
    return local_date(now, tz) + timedelta(days=window.horizon_days)


def prepaid_of(row: Mapping[str, Any]) -> Prepaid | None:
    """A stored price (slot or schedule row), or None for a slot booked at once."""
    if row.get("prepaid_amount") is None:
        return None
    return Prepaid(row["prepaid_amount"], row["prepaid_currency"], row["hold_minutes"])


@dataclass(frozen=True)
class AgendaEntry:
    """One appointment of a slot, as a doctor's agenda shows it."""

    id: int
    patient_id: int
    status: str  # effective: a hold past its end shows EXPIRED
    overbooked: bool = False
    hold_expires_at: datetime | None = None


@dataclass(frozen=True)
class AgendaSlot:
    """A slot of the doctor's day, full or not, with its appointments."""

    id: int
    doctor_id: int
    start_at: datetime
    end_at: datetime
    opens_at: datetime
    capacity: int
    booked_count: int
    overbook_limit: int
    overbooked_count: int
    appointments: tuple[AgendaEntry, ...]


@dataclass(frozen=True)
class Waiting:
    """A patient's place on a slot's waitlist (1 = next to get a freed seat)."""

    slot_id: int
    patient_id: int
    position: int


@dataclass(frozen=True)
class WaitlistEntry:
    """One patient waiting for a seat of a slot, in line order."""

    position: int
    patient_id: int
    since: datetime


@dataclass(frozen=True)
class RepeatingSchedule:
    """A schedule without an end date: its slots are kept generated up to the
    horizon; ``generated_until`` is the last local date already expanded."""

    id: int
    doctor_id: int
    timezone: str
    generated_until: date
    rule: ScheduleRule
    # False when PostgreSQL does not know ``timezone`` (a doctor written before
    # the zone rule, or a database whose tz data lags Python's).
    zone_known: bool = True

    def zone(self) -> ZoneInfo:
        """The doctor's zone; UnknownZone when either side does not know it."""
        if not self.zone_known:
            raise timezones.UnknownZone(f"PostgreSQL does not know time zone {self.timezone!r}")
        return zone(self.timezone)

    @classmethod
    def from_row(cls, row: Mapping[str, Any]) -> RepeatingSchedule:
        rule = ScheduleRule(
            row["first_day"],
            row["first_day"],
            frozenset(row["weekdays"]),
            row["start_time"],
            row["end_time"],
            row["slot_minutes"],
            row["capacity"],
            row["overbook_limit"],
            prepaid_of(row),
            BookingRules(row["min_notice_minutes"], row["max_per_patient_day"]),
        )
        return build(cls, row, rule=rule)

    def next_range(self, until: date) -> ScheduleRule | None:
        """The rule for the dates not generated yet up to ``until`` (None: nothing)."""
        first = max(self.generated_until + timedelta(days=1), self.rule.start_date)
        if first > until:
            return None
        return replace(self.rule, start_date=first, end_date=until)


# No-shows counted by the policy are those of slots that started this long ago at
# most (the contract's "N no-shows within 90 days").
NO_SHOW_WINDOW = timedelta(days=90)


@dataclass(frozen=True)
class NoShowPolicy:
    """A patient with ``limit`` no-shows within NO_SHOW_WINDOW (by the slots'
    start; those marked before an admin's clearing do not count) cannot book
    for ``block_days`` from the start of the last of them."""

    limit: int = 3
    block_days: int = 30


@dataclass(frozen=True)
class NoShowStanding:
    """A patient's no-shows as the console shows them."""

    counted: int  # what the policy counts now
    total: int
    blocked_until: datetime | None


# -- prepaid appointments: what one payment settled ------------------------------------

PaymentOutcome = Literal["confirmed", "overpaid", "underpaid", "not_payable"]


@dataclass(frozen=True)
class Settlement:
    """What one payment of a prepaid appointment settled, and the part of it that
    goes back to the patient (0: nothing to refund)."""

    outcome: PaymentOutcome
    refund: int

    @property
    def confirmed(self) -> bool:
        return self.outcome in ("confirmed", "overpaid")


def settle(amount: int, price: int, *, confirmed: bool, live_hold: bool) -> Settlement:
    """A payment that confirmed a hold keeps the price and returns any excess
    (core.kernel.payments, the one rule for every payment); one that confirmed
    nothing returns all of it: ``underpaid`` while the hold is still live (it
    stays HELD, the patient may pay in full), else ``not_payable``."""
    if not confirmed:
        return Settlement("underpaid" if live_hold else "not_payable", amount)
    split = split_payment(amount, price)
    if split.match == "underpaid":  # the confirm statement and this rule disagree
        raise ValueError(f"a payment of {amount} cannot confirm a price of {price}")
    return Settlement("overpaid" if split.match == "overpaid" else "confirmed", split.refund)


@dataclass(frozen=True)
class Series:
    """Slots booked for one patient at once, all or nothing (0057)."""

    id: int
    patient_id: int
    appointments: tuple[Appointment, ...]
