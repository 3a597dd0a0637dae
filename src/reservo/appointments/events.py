"""Events the appointments module emits, and how each becomes a notification."""

from __future__ import annotations

from datetime import datetime
from typing import Any

from reservo.appointments.domain import Appointment
from reservo.core.kernel.contract import EventSpec
from reservo.core.messaging.notify import Notification
from reservo.core.messaging.transport.base import Event

# An appointment's whole life, under one key: the first appointment of its
# reschedule chain (a reschedule books a new appointment in place of the old).
APPOINTMENT_STREAM = "appointments.appointment.v1"
WAITLIST_STREAM = "appointments.waitlist.v1"
BOOKED = "appointments.appointment.booked.v1"
CANCELLED = "appointments.appointment.cancelled.v1"
REMINDER = "appointments.appointment.reminder-due.v1"
RESCHEDULED = "appointments.appointment.rescheduled.v1"
# A seat freed and went to the first patient of the slot's waitlist who was free.
WAITLIST_BOOKED = "appointments.appointment.booked-from-waitlist.v1"
# A seat freed, but that waiting patient holds another appointment at that time.
WAITLIST_SKIPPED = "appointments.waitlist.patient-skipped.v1"
# The slot's doctor (or an admin) marked a started appointment as missed.
NO_SHOW = "appointments.appointment.no-show.v1"
# Drops the cached slot lists a booking, cancellation or move changed (durably:
# what the request could not drop after its commit).
SLOT_LISTS_CONSUMER = "appointments-slot-lists"
SLOT_LIST_CHANGES = (BOOKED, CANCELLED, RESCHEDULED)
TOPICS = (BOOKED, CANCELLED, REMINDER, RESCHEDULED, WAITLIST_BOOKED, WAITLIST_SKIPPED, NO_SHOW)


def key(appt: Appointment) -> str:
    """One aggregate, one key: the chain a reschedule continues keeps the key
    of its first appointment, so "moved" never overtakes "booked"."""
    return f"appointment:{appt.lineage_id or appt.id}"


def waitlist_key(slot_id: int) -> str:
    return f"slot:{slot_id}"


def payload(appt: Appointment) -> dict[str, Any]:
    seat = skipped_payload(
        appt.slot_id, appt.patient_id, appt.doctor_id, appt.start_at, appt.end_at
    )
    extra = {"overbooked": True} if appt.overbooked else {}
    return {
        "appointmentId": appt.id,
        "firstAppointmentId": appt.lineage_id or appt.id,
        **seat,
        **extra,
    }


def rescheduled_payload(appt: Appointment, old: Appointment) -> dict[str, Any]:
    return {**payload(appt), "rescheduledFrom": old.id, "previousStartAt": old.start_at.isoformat()}


def skipped_payload(
    slot_id: int, patient_id: int, doctor_id: int, start_at: datetime, end_at: datetime
) -> dict[str, Any]:
    """The seat and the patient, as every event of the module names them (a
    skipped patient's event has no appointment; the others add its id first)."""
    return {
        "slotId": slot_id,
        "patientId": patient_id,
        "doctorId": doctor_id,
        "startAt": start_at.isoformat(),
        "endAt": end_at.isoformat(),
    }


def _when(iso: str) -> str:
    return datetime.fromisoformat(iso).strftime("%Y-%m-%d %H:%M UTC")


# (subject, body) of each topic's message, formatted with the event's payload plus
# `start` (startAt as a reader sees it) and, when moved, `previous` (previousStartAt).
_MESSAGES = {
    RESCHEDULED: (
        "Appointment moved to {start}",
        "Your appointment #{rescheduledFrom} at {previous} was moved: appointment "
        "#{appointmentId} with doctor #{doctorId} at {start} is booked.",
    ),
    WAITLIST_BOOKED: (
        "A place freed up: appointment booked for {start}",
        "A place freed up in the slot you were waiting for: appointment "
        "#{appointmentId} with doctor #{doctorId} at {start} is booked for you.",
    ),
    WAITLIST_SKIPPED: (
        "A place freed up at {start}, but you are busy then",
        "A place freed up in slot #{slotId} with doctor #{doctorId} at {start}, but you "
        "hold another appointment at that time, so it went to the next patient and you "
        "left that waitlist.",
    ),
    BOOKED: (
        "Appointment confirmed for {start}",
        "Your appointment #{appointmentId} with doctor #{doctorId} at {start} is booked.",
    ),
    REMINDER: (
        "Reminder: appointment at {start}",
        "Your appointment #{appointmentId} with doctor #{doctorId} is tomorrow at {start}.",
    ),
    CANCELLED: (
        "Appointment for {start} cancelled",
        "Your appointment #{appointmentId} at {start} was cancelled.",
    ),
    NO_SHOW: (
        "Missed appointment at {start}",
        "Your appointment #{appointmentId} with doctor #{doctorId} at {start} was marked "
        "as missed. Repeated missed appointments block online booking for a while.",
    ),
}
# A waiting patient skipped because the no-show policy blocks their bookings.
_SKIPPED_BLOCKED = (
    "A place freed up at {start}, but your booking is blocked",
    "A place freed up in slot #{slotId} with doctor #{doctorId} at {start}, but "
    "booking is blocked for you after missed appointments, so it went to the next "
    "patient and you left that waitlist.",
)


def notifications(event: Event) -> list[Notification]:
    p = event.payload
    fields = {**p, "start": _when(p["startAt"])}
    if "previousStartAt" in p:
        fields["previous"] = _when(p["previousStartAt"])
    subject, body = _MESSAGES[event.topic]
    if p.get("reason") == "no_show_limit":
        subject, body = _SKIPPED_BLOCKED
    message = Notification(
        int(p["patientId"]), subject.format(**fields), body.format(**fields), str(event.id)
    )
    return [message]


# -- the contract (core/kernel/contract.py): what a subscriber may rely on ---------------

_ID = {"type": "integer", "minimum": 1}
_TIME = {"type": "string", "format": "date-time"}
_SEAT = {
    "slotId": _ID,
    "patientId": _ID,
    "doctorId": _ID,
    "startAt": _TIME,
    "endAt": _TIME,
}
_APPOINTMENT = {
    "appointmentId": {**_ID, "description": "This appointment."},
    "firstAppointmentId": {
        **_ID,
        "description": "The first appointment of its reschedule chain (the key's id).",
    },
    **_SEAT,
}
_EXAMPLE = {
    "appointmentId": 42,
    "firstAppointmentId": 42,
    "slotId": 7,
    "patientId": 1001,
    "doctorId": 3,
    "startAt": "2030-01-07T09:00:00+00:00",
    "endAt": "2030-01-07T09:30:00+00:00",
}


# Only on a staff booking beyond the slot's capacity (absent otherwise).
_OPTIONAL = {
    "overbooked": {
        "type": "boolean",
        "const": True,
        "description": "A staff booking beyond the slot's capacity (an overbooked seat).",
    }
}


def _schema(properties: dict[str, Any]) -> dict[str, Any]:
    return {
        "type": "object",
        "required": sorted(properties),
        "properties": {**properties, **_OPTIONAL},
        "additionalProperties": True,
    }


def _appointment_event(name: str, formerly: tuple[str, ...], summary: str) -> EventSpec:
    return EventSpec(
        name=name,
        stream=APPOINTMENT_STREAM,
        summary=summary,
        key="appointment:{firstAppointmentId}",
        key_doc="the first appointment of the reschedule chain: one appointment's "
        "whole life (booking, moves, reminder, no-show, cancel) in order",
        schema=_schema(_APPOINTMENT),
        example=_EXAMPLE,
        formerly=formerly,
    )


CONTRACT = (
    _appointment_event(BOOKED, ("appointments.booked.v1",), "A patient booked a seat."),
    _appointment_event(CANCELLED, ("appointments.cancelled.v1",), "An appointment was cancelled."),
    _appointment_event(
        REMINDER, ("appointments.reminder.v1",), "An appointment is due (the reminder time came)."
    ),
    _appointment_event(
        NO_SHOW, (), "The slot's doctor marked a started appointment as missed (NO_SHOW)."
    ),
    _appointment_event(
        WAITLIST_BOOKED,
        ("appointments.waitlist_booked.v1",),
        "A freed seat was booked for the first free patient of the slot's waitlist.",
    ),
    EventSpec(
        name=RESCHEDULED,
        stream=APPOINTMENT_STREAM,
        summary="An appointment was moved: appointmentId is the new one, rescheduledFrom "
        "the one it replaced (now cancelled).",
        key="appointment:{firstAppointmentId}",
        key_doc="the first appointment of the reschedule chain, the key of the "
        "replaced appointment's events too",
        schema=_schema(
            {
                **_APPOINTMENT,
                "rescheduledFrom": {**_ID, "description": "The appointment it replaced."},
                "previousStartAt": _TIME,
            }
        ),
        example={
            **_EXAMPLE,
            "appointmentId": 43,
            "slotId": 8,
            "startAt": "2030-01-08T09:00:00+00:00",
            "endAt": "2030-01-08T09:30:00+00:00",
            "rescheduledFrom": 42,
            "previousStartAt": "2030-01-07T09:00:00+00:00",
        },
        formerly=("appointments.rescheduled.v1",),
    ),
    EventSpec(
        name=WAITLIST_SKIPPED,
        stream=WAITLIST_STREAM,
        summary="A seat freed, but the first waiting patient holds another appointment "
        "then: skipped, and off that waitlist.",
        key="slot:{slotId}",
        key_doc="the slot whose waitlist it is: one waitlist's turns in order",
        schema=_schema(
            {
                **_SEAT,
                "reason": {
                    "type": "string",
                    "enum": ["busy", "no_show_limit"],
                    "description": "busy: another appointment then; no_show_limit: "
                    "booking is blocked after missed appointments.",
                },
            }
        ),
        example={**{k: v for k, v in _EXAMPLE.items() if k in _SEAT}, "reason": "busy"},
        formerly=("appointments.waitlist_skipped.v1",),
    ),
)
