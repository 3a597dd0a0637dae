"""Pure rules of period rentals: stored periods, deposits, the refund policy.

No I/O. Times are timezone-aware instants; `now` is always the server clock,
passed in by the caller."""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from decimal import ROUND_HALF_UP, Decimal
from typing import Any, Literal

from reservo.core.db.rows import FromRow
from reservo.core.kernel.payments import split_payment

Status = Literal["HOLD", "CONFIRMED", "ON_TRIP", "COMPLETED", "CANCELLED", "EXPIRED"]
# Statuses that occupy the car (the exclusion constraint's predicate).
BLOCKING: frozenset[str] = frozenset({"HOLD", "CONFIRMED", "ON_TRIP"})
Canceller = Literal["customer", "host", "admin"]

DAY = timedelta(days=1)
# Longest trip and farthest start accepted; beyond that a request is absurd (422).
MAX_TRIP = timedelta(days=90)
MAX_AHEAD = timedelta(days=730)


class InvalidPeriod(ValueError):
    pass


@dataclass(frozen=True, slots=True)
class Car(FromRow):
    id: int
    plate: str
    model: str
    city: str
    daily_price: int
    host_id: int


@dataclass(frozen=True, slots=True)
class Booking(FromRow):
    """A booking as the use cases return it; ``from_at`` is the customer's start
    (the stored period's lower bound), ``return_at`` their end (before the buffer)."""

    id: int
    car_id: int
    customer_id: int
    from_at: datetime
    return_at: datetime
    status: str
    deposit_amount: int
    refund_amount: int | None
    # The excess of the payment that confirmed it, returned at once (0: paid
    # exactly); None while no payment confirmed it, or when it was confirmed
    # before 0029 recorded what a payment settles.
    overpaid_refund: int | None
    hold_expires_at: datetime | None
    created_at: datetime
    # The car's host: read with every row that emits an event; None in a
    # customer's list, which does not need it.
    host_id: int | None = None
    # When its HOLD was extended (the one extension a hold may get); None: never,
    # or a row read by a statement that does not need it.
    hold_extended_at: datetime | None = None


@dataclass(frozen=True, slots=True)
class BlockedPeriod:
    """One entry of a car's calendar: a live booking and the end of its buffer."""

    booking_id: int
    from_at: datetime
    return_at: datetime
    buffer_until: datetime
    status: str

    @classmethod
    def from_row(cls, row: Mapping[str, Any]) -> BlockedPeriod:
        return cls(row["id"], row["from_at"], row["return_at"], row["buffer_until"], row["status"])


@dataclass(frozen=True)
class StoredPeriod:
    """The half-open range the database stores: [start, end + buffer)."""

    lower: datetime
    upper: datetime


def days_of(period: StoredPeriod) -> list[str]:
    """The UTC days [lower, upper) touches, as ISO dates: a hold and a search
    that share no day cannot overlap, so a hold drops only the cached searches
    of its days (at most MAX_TRIP plus the turnaround: a few dozen)."""
    first = period.lower.astimezone(UTC).date()
    last = (period.upper.astimezone(UTC) - timedelta(microseconds=1)).date()
    return [(first + timedelta(days=n)).isoformat() for n in range((last - first).days + 1)]


def stored_period(start: datetime, end: datetime, turnaround: timedelta) -> StoredPeriod:
    """The one place the turnaround buffer is added: after the trip's end, so the
    next customer can only start once the car has been cleaned and checked."""
    return StoredPeriod(start, end + turnaround)


def check_period(start: datetime, end: datetime, now: datetime) -> None:
    if start.tzinfo is None or end.tzinfo is None:
        raise InvalidPeriod("timestamps need an offset")
    if end <= start:
        raise InvalidPeriod("'to' must be after 'from'")
    if end - start > MAX_TRIP:
        raise InvalidPeriod(f"a trip lasts at most {MAX_TRIP.days} days")
    if start < now:
        raise InvalidPeriod("'from' is in the past")
    if start - now > MAX_AHEAD:
        raise InvalidPeriod(f"bookings open at most {MAX_AHEAD.days} days ahead")


def rental_days(start: datetime, end: datetime) -> int:
    """Started days count as whole days; at least one."""
    return max(1, math.ceil((end - start) / DAY))


# The smallest deposit: a hold is confirmed only by money actually received, so
# no period (a cheap car, a rate of 0) may owe nothing.
MIN_DEPOSIT = 1


def deposit(start: datetime, end: datetime, daily_price: int, rate: float) -> int:
    """ceil(days) * dailyPrice * rate, rounded half up to a whole minor unit, at
    least MIN_DEPOSIT. Decimal(str(rate)) so 0.3 means 3/10, not the nearest
    binary float."""
    exact = Decimal(rental_days(start, end) * daily_price) * Decimal(str(rate))
    return max(MIN_DEPOSIT, int(exact.quantize(Decimal(1), rounding=ROUND_HALF_UP)))


Outcome = Literal["confirmed", "overpaid", "underpaid", "not_payable"]


@dataclass(frozen=True)
class Settlement:
    """What one deposit payment settled: its outcome and the part of it that goes
    back to the customer (0: nothing to refund)."""

    outcome: Outcome
    refund: int

    @property
    def confirmed(self) -> bool:
        return self.outcome in ("confirmed", "overpaid")


def settle(amount: int, due: int, *, confirmed: bool, live_hold: bool) -> Settlement:
    """A payment that confirmed keeps the deposit: paid exactly, ``confirmed``;
    paid more, ``overpaid`` and the excess goes back (core.kernel.payments, the
    rule every payment follows). One that did not confirm keeps nothing. A live
    HOLD left unconfirmed was paid less than ``due`` (zero included):
    ``underpaid``, the hold stays a HOLD and the customer may still pay in full;
    otherwise the booking was no longer payable."""
    if not confirmed:
        return Settlement("underpaid" if live_hold else "not_payable", amount)
    split = split_payment(amount, due)
    if split.match == "underpaid":  # the confirm statement and this rule disagree
        raise ValueError(f"a payment of {amount} cannot confirm a deposit of {due}")
    return Settlement("overpaid" if split.match == "overpaid" else "confirmed", split.refund)


FULL_REFUND_BEFORE = timedelta(hours=72)
HALF_REFUND_BEFORE = timedelta(hours=24)


def refund_amount(
    deposit_amount: int, pickup_at: datetime, cancelled_at: datetime, cancelled_by: Canceller
) -> int:
    """The refund for cancelling a CONFIRMED booking. The host (or the platform)
    cancelling refunds everything; a customer gets 100 % at >= 72 h before
    pickup, 50 % (rounded down) at >= 24 h, else nothing. ``cancelled_at`` is
    the server's clock, never the client's: minutes around a boundary are money."""
    if cancelled_by != "customer":
        return deposit_amount
    before = pickup_at - cancelled_at
    if before >= FULL_REFUND_BEFORE:
        return deposit_amount
    if before >= HALF_REFUND_BEFORE:
        return deposit_amount // 2
    return 0


def effective_status(status: str, hold_expires_at: datetime | None, now: datetime) -> str:
    """A HOLD past its expiry is EXPIRED even before a job has flipped the row."""
    if status == "HOLD" and hold_expires_at is not None and hold_expires_at <= now:
        return "EXPIRED"
    return status


def extension_refusal(b: Booking, now: datetime) -> tuple[str, str]:
    """Why the conditional UPDATE extended nothing, as (code, detail), from the
    booking read after it. The UPDATE decided; this only names the reason."""
    status = effective_status(b.status, b.hold_expires_at, now)
    if status == "EXPIRED":
        return "hold_expired", "the hold has expired: it can no longer be extended"
    if status != "HOLD":
        return "invalid_state", f"booking is {status}, expected HOLD"
    if b.hold_extended_at is not None:
        return "hold_extended", "this hold was extended already (once per booking)"
    # Still a HOLD, never extended: it expired at the UPDATE's clock reading.
    return "hold_expired", "the hold has expired: it can no longer be extended"


@dataclass(frozen=True)
class Quote:
    days: int
    price: int
    deposit: int


def quote(start: datetime, end: datetime, daily_price: int, rate: float) -> Quote:
    """What a hold of [start, end) costs: started days, their price, and the deposit
    the hold would charge (the same function the hold uses)."""
    days = rental_days(start, end)
    return Quote(days, days * daily_price, deposit(start, end, daily_price, rate))


# The widest calendar window one request may ask for.
MAX_CALENDAR_SPAN = timedelta(days=366)


def check_window(start: datetime, end: datetime) -> None:
    """A calendar's [start, end): non-empty and at most MAX_CALENDAR_SPAN wide."""
    if end <= start:
        raise InvalidPeriod("'to' must be after 'from'")
    if end - start > MAX_CALENDAR_SPAN:
        raise InvalidPeriod(f"a calendar spans at most {MAX_CALENDAR_SPAN.days} days")


def hold_retry_after(
    recent: list[datetime], limit: int, window: timedelta, now: datetime
) -> int | None:
    """None when one more hold is allowed, else the whole seconds (>= 1) until one is.

    ``recent``: the customer's holds created within ``window`` before ``now``,
    newest first, at most ``limit`` of them. A sliding window: a hold counts for
    ``window`` after its creation, so the next one is allowed when the
    ``limit``-th most recent leaves the window."""
    if len(recent) < limit:
        return None
    if limit <= 0 or not recent:
        return max(1, math.ceil(window.total_seconds()))
    leaves = recent[limit - 1] + window
    return max(1, math.ceil((leaves - now).total_seconds()))
