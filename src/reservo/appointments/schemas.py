"""Request and response bodies of the Appointments API."""

from __future__ import annotations

from datetime import datetime, time
from typing import Annotated, Literal

from pydantic import Field, StrictInt, field_validator, model_validator

from reservo.appointments.domain import InvalidTimezone, zone
from reservo.core.schemas import ApiModel, Day

Id = Annotated[StrictInt, Field(ge=1, le=2**63 - 1)]


class DoctorIn(ApiModel):
    name: Annotated[str, Field(min_length=1, max_length=200)]
    timezone: Annotated[str, Field(min_length=1, max_length=64, examples=["Europe/Lisbon"])]
    specialty: Annotated[str | None, Field(max_length=200)] = None

    @field_validator("timezone")
    @classmethod
    def _known_zone(cls, v: str) -> str:
        try:
            zone(v)
        except InvalidTimezone as exc:
            raise ValueError(str(exc)) from None
        return v


class Doctor(ApiModel):
    id: int
    name: str
    timezone: str
    specialty: str | None


class ScheduleIn(ApiModel):
    from_: Annotated[Day, Field(alias="from")]
    to: Day
    weekdays: Annotated[
        list[Annotated[StrictInt, Field(ge=1, le=7)]], Field(min_length=1, max_length=7)
    ]
    start_time: Annotated[time, Field(examples=["08:00"])]
    end_time: Annotated[time, Field(examples=["18:00"])]
    slot_minutes: Annotated[StrictInt, Field(ge=5, le=720)] = 15
    capacity: Annotated[StrictInt, Field(ge=1, le=10_000)] = 1

    @field_validator("start_time", "end_time")
    @classmethod
    def _naive(cls, v: time) -> time:
        if v.tzinfo is not None:
            raise ValueError("local times carry no offset; the doctor's time zone applies")
        return v

    @model_validator(mode="after")
    def _coherent(self) -> ScheduleIn:
        if self.to < self.from_:
            raise ValueError("'to' is before 'from'")
        if (self.to - self.from_).days + 1 > 92:
            raise ValueError("at most 92 days per call")
        if self.end_time <= self.start_time:
            raise ValueError("endTime must be after startTime")
        if len(set(self.weekdays)) != len(self.weekdays):
            raise ValueError("weekdays repeat")
        return self


class ScheduleOut(ApiModel):
    created: int
    skipped: int


class SlotOut(ApiModel):
    id: int
    doctor_id: int
    start_at: datetime
    end_at: datetime
    capacity: int
    booked_count: int
    available: int


class AppointmentIn(ApiModel):
    slot_id: Id
    patient_id: Id


class AppointmentOut(ApiModel):
    id: int
    slot_id: int
    patient_id: int
    status: Literal["BOOKED", "CANCELLED"]
    start_at: datetime
    end_at: datetime
    created_at: datetime
