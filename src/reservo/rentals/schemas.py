"""Request and response bodies of the Rentals API."""

from __future__ import annotations

from datetime import datetime
from typing import Annotated, Literal

from pydantic import AfterValidator, Field, StrictInt, StringConstraints, with_config

from reservo.core.http.schemas import ApiModel, Id, Instant
from reservo.rentals import domain

Money = Annotated[StrictInt, Field(ge=0, le=10**15)]
# Plates and txn ids are visible ASCII without surrounding spaces.
Plate = Annotated[str, StringConstraints(pattern=r"^[A-Za-z0-9][A-Za-z0-9 .\-]{0,18}[A-Za-z0-9]$")]


def _printable(v: str) -> str:
    # PostgreSQL text cannot hold NUL, and control characters are never a name.
    if any(ord(ch) < 32 or ord(ch) == 127 for ch in v) or v != v.strip():
        raise ValueError("control characters or surrounding spaces")
    return v


City = Annotated[str, StringConstraints(min_length=1, max_length=50), AfterValidator(_printable)]
Name = Annotated[str, StringConstraints(min_length=1, max_length=100), AfterValidator(_printable)]


class CarIn(ApiModel):
    plate: Plate
    model: Name
    city: City
    daily_price: Annotated[StrictInt, Field(ge=1, le=10**12)]
    host_id: Id


# A car on the wire: the domain's car, its fields in camelCase. Only ever answered
# (never parsed), so it is the dataclass itself rather than a model restating it.
@with_config(ApiModel.model_config)
class Car(domain.Car):
    pass


class BookingIn(ApiModel):
    car_id: Id
    customer_id: Id
    from_: Annotated[Instant, Field(alias="from", examples=["2026-01-25T08:00:00+07:00"])]
    to: Annotated[Instant, Field(examples=["2026-01-28T20:00:00+07:00"])]


BookingStatus = Literal["HOLD", "CONFIRMED", "ON_TRIP", "COMPLETED", "CANCELLED", "EXPIRED"]


class BookingOut(ApiModel):
    booking_id: int
    car_id: int
    customer_id: int
    from_: Annotated[datetime, Field(alias="from")]
    to: datetime
    status: BookingStatus
    deposit_amount: int
    hold_expires_at: datetime | None
    payment_url: str | None
    refund_amount: int | None


class WebhookIn(ApiModel):
    booking_id: Id
    provider_txn_id: Annotated[str, StringConstraints(pattern=r"^[\x21-\x7e]{1,64}$")]
    amount: Money
    status: Literal["SUCCEEDED", "FAILED"]


class WebhookOut(ApiModel):
    result: Literal["confirmed", "duplicate", "refund_requested", "ignored"]


# -- second release: a customer's bookings, a car's calendar, a quote ----------------


class BookingPage(ApiModel):
    items: list[BookingOut]
    next: Annotated[
        str | None, Field(description="cursor of the next page (`after`), null on the last")
    ]


class CalendarPeriod(ApiModel):
    booking_id: int
    from_: Annotated[datetime, Field(alias="from", description="the trip's start")]
    to: Annotated[datetime, Field(description="the trip's end, as the customer asked")]
    buffer_until: Annotated[
        datetime,
        Field(description="end of the turnaround buffer after `to`: the car is blocked until then"),
    ]
    status: Literal["HOLD", "CONFIRMED", "ON_TRIP"]


class Calendar(ApiModel):
    car_id: int
    periods: list[CalendarPeriod]


class QuoteOut(ApiModel):
    car_id: int
    days: Annotated[int, Field(description="started days: ceil((to - from) / 1 day), at least 1")]
    price: Annotated[int, Field(description="days x dailyPrice, minor units")]
    deposit_amount: Annotated[int, Field(description="what a hold of this period would charge")]
    available: Annotated[
        bool, Field(description="a hold of this period would find the car free right now")
    ]
