"""Request and response bodies of the Appointments API."""

from __future__ import annotations

from datetime import datetime, time
from typing import Annotated, Literal

from pydantic import Field, StrictBool, StrictInt, field_validator, model_validator

from reservo.core.http.schemas import ApiModel, Day, Id
from reservo.core.kernel.timezones import Zone


class DoctorIn(ApiModel):
    name: Annotated[str, Field(min_length=1, max_length=200)]
    timezone: Zone
    specialty: Annotated[str | None, Field(max_length=200)] = None


class Doctor(ApiModel):
    id: int
    name: str
    timezone: str
    specialty: str | None


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
    start_time: Annotated[time, Field(examples=["08:00"])]
    end_time: Annotated[time, Field(examples=["18:00"])]
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

    @field_validator("start_time", "end_time")
    @classmethod
    def _naive(cls, v: time) -> time:
        if v.tzinfo is not None:
            raise ValueError("local times carry no offset; the doctor's time zone applies")
        return v

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


Status = Literal["BOOKED", "CANCELLED", "NO_SHOW"]


class AppointmentOut(ApiModel):
    id: int
    slot_id: int
    patient_id: int
    status: Status
    start_at: datetime
    end_at: datetime
    created_at: datetime
    overbooked: Annotated[bool, Field(description="a staff booking beyond capacity")]


class AppointmentPage(ApiModel):
    items: list[AppointmentOut]
    next: Annotated[str | None, Field(description="cursor of the next page; null: last")]


class AgendaAppointment(ApiModel):
    id: int
    patient_id: int
    status: Status
    overbooked: bool


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


class ContactIn(ApiModel):
    """Both are replaced; an omitted or null one is cleared (the channel's default
    address applies to it)."""

    email: Email | None = None
    phone: Phone | None = None


class ContactOut(ApiModel):
    patient_id: int
    email: str | None
    phone: str | None


class CalendarLinkOut(ApiModel):
    url: Annotated[
        str,
        Field(
            description="the secret URL of the calendar feed (text/calendar, RFC 5545) to "
            "subscribe to; whoever holds it reads the feed. A new link revokes this one."
        ),
    ]
