"""Request and response bodies of the Rentals API."""

from __future__ import annotations

from datetime import datetime
from typing import Annotated, Literal

from pydantic import (
    AfterValidator,
    Field,
    StrictInt,
    StringConstraints,
    model_validator,
    with_config,
)

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


class CarPage(ApiModel):
    items: list[Car]
    next: Annotated[
        str | None, Field(description="cursor of the next page (`after`), null on the last")
    ]


class BookingIn(ApiModel):
    car_id: Id
    customer_id: Id
    # No examples: any fixed instant is soon in the past, which a hold refuses.
    from_: Annotated[
        Instant,
        Field(
            alias="from",
            description=(
                f"the start: not in the past, at most {domain.MAX_AHEAD.days} days ahead "
                "(422 otherwise)"
            ),
        ),
    ]
    to: Annotated[
        Instant,
        Field(
            description=(
                f"the end: after `from`, at most {domain.MAX_TRIP.days} days after it "
                "(422 otherwise)"
            )
        ),
    ]


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
    refund_amount: Annotated[
        int | None, Field(description="what a cancellation refunds of the deposit")
    ]
    overpaid_refund: Annotated[
        int | None,
        Field(
            description="the excess of the payment that confirmed the booking (amount "
            "minus depositAmount), refunded at once apart from any cancellation refund; "
            "0: paid exactly; null while no payment confirmed it"
        ),
    ]


class WebhookIn(ApiModel):
    """A payment of a rental's deposit (`bookingId`) or of a prepaid appointment
    (`appointmentId`): exactly one of the two."""

    booking_id: Id | None = None
    appointment_id: Id | None = None
    provider_txn_id: Annotated[str, StringConstraints(pattern=r"^[\x21-\x7e]{1,64}$")]
    amount: Money
    status: Literal["SUCCEEDED", "FAILED"]

    @model_validator(mode="after")
    def _one_target(self) -> WebhookIn:
        if (self.booking_id is None) == (self.appointment_id is None):
            raise ValueError("exactly one of bookingId and appointmentId")
        return self


class WebhookOut(ApiModel):
    result: Literal["confirmed", "overpaid", "duplicate", "refund_requested", "ignored"]


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
