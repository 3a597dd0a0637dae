"""Request and response bodies of the Appointments API."""

from __future__ import annotations

import re
from datetime import datetime, time
from typing import Annotated, Any, Literal

from pydantic import AfterValidator, BeforeValidator, Field, StrictBool, StrictInt, model_validator

from reservo.core.http.schemas import ApiModel, Day, Id
from reservo.core.kernel.currencies import ISO_4217
from reservo.core.kernel.timezones import Zone
from reservo.notifications import subscriptions


class DoctorIn(ApiModel):
    name: Annotated[str, Field(min_length=1, max_length=200)]
    timezone: Zone
    specialty: Annotated[str | None, Field(max_length=200)] = None


class Doctor(ApiModel):
    id: int
    name: str
    timezone: str
    specialty: str | None


# A schedule's times are whole minutes or seconds: a slot starting at 08:00:00.5
# is no time a patient is told, and its bounds would never meet another slot's.
_WHOLE_SECONDS = re.compile(r"^\d{2}:\d{2}(:\d{2})?$")


def _whole_seconds(value: Any) -> Any:
    if not isinstance(value, str) or not _WHOLE_SECONDS.fullmatch(value):
        # No offset either: the doctor's time zone applies.
        raise ValueError("a time of day is HH:MM or HH:MM:SS (whole seconds, no offset)")
    return value


def _local_time_schema(schema: dict[str, Any]) -> None:
    # Not `format: time`: RFC 3339's time carries an offset and may have
    # fractions; this one has neither, which only the pattern says.
    schema.pop("format", None)
    schema["pattern"] = _WHOLE_SECONDS.pattern


LocalTime = Annotated[
    time,
    BeforeValidator(_whole_seconds),
    Field(
        description="the doctor's local time: HH:MM or HH:MM:SS (whole seconds, no offset)",
        json_schema_extra=_local_time_schema,
    ),
]


def _iso_4217(code: str) -> str:
    # A price is paid through a payment gateway: ISO 4217's codes only (the
    # wallet's RESERVO_WALLET_CURRENCIES units are the wallet's own).
    if code not in ISO_4217:
        raise ValueError(f"currency {code!r} is not an ISO 4217 code")
    return code


class PrepaidIn(ApiModel):
    """The price of each slot of the schedule, paid before the seat is confirmed."""

    amount: Annotated[StrictInt, Field(ge=1, le=10**15, description="minor units")]
    currency: Annotated[
        str,
        Field(pattern=r"^[A-Z]{3}$", examples=["EUR"], description="ISO 4217 code"),
        AfterValidator(_iso_4217),
    ]
    hold_minutes: Annotated[
        StrictInt,
        Field(
            ge=1,
            le=1440,
            description="how long a booked seat is HELD for its payment before it expires",
        ),
    ] = 15


# The longest minimum notice: the booking horizon's order of magnitude (30 days).
MAX_NOTICE_MINUTES = 30 * 24 * 60


class ScheduleIn(ApiModel):
    from_: Annotated[Day, Field(alias="from")]
    to: Annotated[
        Day | None,
        Field(
            description="the last date; omitted, the schedule repeats: its slots are kept "
            "generated up to the booking horizon, day after day"
        ),
    ] = None
    weekdays: Annotated[
        list[Annotated[StrictInt, Field(ge=1, le=7)]], Field(min_length=1, max_length=7)
    ]
    start_time: Annotated[LocalTime, Field(examples=["08:00"])]
    end_time: Annotated[LocalTime, Field(examples=["18:00"])]
    slot_minutes: Annotated[StrictInt, Field(ge=5, le=720)] = 15
    capacity: Annotated[StrictInt, Field(ge=1, le=10_000)] = 1
    overbook_limit: Annotated[
        StrictInt,
        Field(
            ge=0,
            le=10_000,
            description="seats the slot's doctor or an admin may book beyond capacity "
            '(POST /api/appointments with "overbook": true), counted apart',
        ),
    ] = 0
    prepaid: Annotated[
        PrepaidIn | None,
        Field(
            description="omitted: slots are booked at once. Given: booking a slot answers "
            'status "HELD" with holdExpiresAt and paymentUrl; the payment webhook makes it '
            "BOOKED, and unpaid by holdExpiresAt it becomes EXPIRED and frees its seat"
        ),
    ] = None
    min_notice_minutes: Annotated[
        StrictInt,
        Field(
            ge=0,
            le=MAX_NOTICE_MINUTES,
            description="a patient books (or reschedules into) a slot at least this many "
            "minutes before its start, by the server's clock (409 too_late_to_book); the "
            "slot's doctor and admins are not bound. 0: up to the start",
        ),
    ] = 0
    max_per_patient_per_day: Annotated[
        StrictInt | None,
        Field(
            ge=1,
            le=1000,
            description="the most appointments (BOOKED or HELD) a patient may hold with "
            "the doctor on one local day in the doctor's time zone (409 daily_limit "
            "beyond it). Omitted or null: no limit",
        ),
    ] = None

    @model_validator(mode="after")
    def _coherent(self) -> ScheduleIn:
        if self.to is not None and self.to < self.from_:
            raise ValueError("'to' is before 'from'")
        if self.to is not None and (self.to - self.from_).days + 1 > 92:
            raise ValueError("at most 92 days per call")
        if self.end_time <= self.start_time:
            raise ValueError("endTime must be after startTime")
        if len(set(self.weekdays)) != len(self.weekdays):
            raise ValueError("weekdays repeat")
        return self


class ScheduleOut(ApiModel):
    created: int
    skipped: Annotated[
        int,
        Field(
            description="slots not created because they exist, or overlap another slot "
            "of the doctor (a doctor's slots never overlap, whatever their lengths)"
        ),
    ]


class RepeatingScheduleOut(ScheduleOut):
    """A schedule without `to`: the slots generated so far (up to the horizon)."""

    schedule_id: int


class SlotOut(ApiModel):
    id: int
    doctor_id: int
    start_at: datetime
    end_at: datetime
    capacity: int
    booked_count: int
    available: int
    overbooked_count: Annotated[int, Field(description="staff bookings beyond capacity")]


class AppointmentIn(ApiModel):
    slot_id: Id
    patient_id: Id
    overbook: Annotated[
        StrictBool,
        Field(
            description="book beyond capacity, up to the slot's overbookLimit: the "
            "slot's doctor or an admin only (403 for patients); always takes an "
            "overbooked seat"
        ),
    ] = False


Status = Literal["HELD", "BOOKED", "CANCELLED", "NO_SHOW", "EXPIRED"]


class Price(ApiModel):
    amount: Annotated[int, Field(description="minor units")]
    currency: str


class AppointmentOut(ApiModel):
    id: int
    slot_id: int
    patient_id: int
    status: Annotated[
        Status,
        Field(
            description="HELD: a prepaid slot's seat, counted, until paid (BOOKED) or "
            "holdExpiresAt (EXPIRED, the seat freed)"
        ),
    ]
    start_at: datetime
    end_at: datetime
    created_at: datetime
    overbooked: Annotated[bool, Field(description="a staff booking beyond capacity")]
    # The prepaid fields: present only on an appointment of a prepaid slot.
    price: Annotated[
        Price | None,
        Field(description="a prepaid slot's price (absent: booked at once, no price)"),
    ] = None
    hold_expires_at: Annotated[
        datetime | None, Field(description="while HELD (and once EXPIRED): when the hold ends")
    ] = None
    payment_url: Annotated[
        str | None,
        Field(description="while HELD: where the patient pays (null: no gateway page)"),
    ] = None
    overpaid_refund: Annotated[
        int | None,
        Field(
            description="the excess of the payment that confirmed it, refunded (0: paid "
            "exactly; null: no payment confirmed it)"
        ),
    ] = None


class AppointmentPage(ApiModel):
    items: list[AppointmentOut]
    next: Annotated[str | None, Field(description="cursor of the next page; null: last")]


class AgendaAppointment(ApiModel):
    id: int
    patient_id: int
    status: Status
    overbooked: bool
    hold_expires_at: Annotated[
        datetime | None,
        Field(
            description="while HELD: when its hold ends (absent otherwise)",
            exclude_if=lambda v: v is None,
        ),
    ] = None


class AgendaSlot(ApiModel):
    id: int
    doctor_id: int
    start_at: datetime
    end_at: datetime
    opens_at: Annotated[datetime, Field(description="when the slot opens for booking")]
    capacity: int
    booked_count: int
    available: int
    overbook_limit: int
    overbooked_count: int
    appointments: list[AgendaAppointment]


class Agenda(ApiModel):
    doctor_id: int
    date: Day
    slots: list[AgendaSlot]


class AppointmentRescheduleIn(ApiModel):
    slot_id: Id


class RescheduledOut(AppointmentOut):
    rescheduled_from: Annotated[int, Field(description="the appointment this one replaced")]


class WaitlistIn(ApiModel):
    patient_id: Id


class WaitlistOut(ApiModel):
    slot_id: int
    patient_id: int
    position: Annotated[int, Field(description="1: the next to get a freed seat")]


Email = Annotated[
    str,
    Field(
        max_length=254,
        pattern=r"^[^@\s]+@[^@\s]+\.[^@\s]+$",
        examples=["ana@example.com"],
    ),
]
Phone = Annotated[
    str,
    Field(pattern=r"^\+[1-9][0-9]{6,14}$", examples=["+351912345678"], description="E.164"),
]


class PushKeys(ApiModel):
    p256dh: Annotated[
        str,
        Field(
            alias="p256dh",  # the browser's spelling, not camelCase's p256Dh
            max_length=200,
            description="the browser's P-256 ECDH public key, uncompressed (65 bytes), base64url",
        ),
    ]
    auth: Annotated[
        str, Field(max_length=100, description="the browser's auth secret (16 bytes), base64url")
    ]

    @model_validator(mode="after")
    def _keys(self) -> PushKeys:
        why = subscriptions.keys_problem(self.p256dh, self.auth)
        if why is not None:
            raise ValueError(why)
        return self


class PushSubscriptionIn(ApiModel):
    """The browser Push API's subscription as ``PushSubscription.toJSON()`` gives it."""

    endpoint: Annotated[
        str,
        Field(
            max_length=subscriptions.MAX_ENDPOINT,
            description="the push service's URL for this browser: https, and a destination "
            "the egress rules of `http` jobs allow (RESERVO_JOBS_HTTP_ALLOW)",
            examples=["https://fcm.googleapis.com/fcm/send/dGVzdA"],
        ),
    ]
    # Sent by browsers (null unless the push service expires subscriptions); not kept.
    expiration_time: int | None = None
    keys: PushKeys

    def value(self) -> subscriptions.PushSubscription:
        return subscriptions.PushSubscription(self.endpoint, self.keys.p256dh, self.keys.auth)


class PushSubscriptionOut(ApiModel):
    endpoint: str
    keys: PushKeys


class ContactIn(ApiModel):
    """All are replaced; an omitted or null address is cleared (the channel's
    default address applies to it), omitted push subscriptions are removed."""

    email: Email | None = None
    phone: Phone | None = None
    push_subscriptions: Annotated[
        list[PushSubscriptionIn],
        Field(
            max_length=subscriptions.MAX_SUBSCRIPTIONS,
            description="Web Push subscriptions (one per browser), each notified",
        ),
    ] = Field(default_factory=list)

    @model_validator(mode="after")
    def _distinct(self) -> ContactIn:
        endpoints = [s.endpoint for s in self.push_subscriptions]
        if len(set(endpoints)) != len(endpoints):
            raise ValueError("pushSubscriptions: an endpoint is given twice")
        return self


class ContactOut(ApiModel):
    patient_id: int
    email: str | None
    phone: str | None
    push_subscriptions: list[PushSubscriptionOut]


class CalendarLinkOut(ApiModel):
    url: Annotated[
        str,
        Field(
            description="the secret URL of the calendar feed (text/calendar, RFC 5545) to "
            "subscribe to; whoever holds it reads the feed. A new link revokes this one."
        ),
    ]


# -- fourth release: series -----------------------------------------------------------

# The most slots one series books.
MAX_SERIES_SLOTS = 52


class SeriesIn(ApiModel):
    patient_id: Id
    slot_ids: Annotated[
        list[Id],
        Field(
            min_length=1,
            max_length=MAX_SERIES_SLOTS,
            description="booked all or nothing, each as POST /api/appointments would; "
            "no slot twice",
        ),
    ]

    @model_validator(mode="after")
    def _distinct(self) -> SeriesIn:
        if len(set(self.slot_ids)) != len(self.slot_ids):
            raise ValueError("slotIds repeat")
        return self


class SeriesOut(ApiModel):
    series_id: int
    appointments: Annotated[list[AppointmentOut], Field(description="in time order")]
