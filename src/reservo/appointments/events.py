"""Events the appointments module emits, and how each becomes a notification."""

from __future__ import annotations

from datetime import datetime
from typing import Any

from reservo.appointments.domain import Appointment
from reservo.core.notify import Notification
from reservo.core.transport.base import Event

BOOKED = "appointments.booked.v1"
CANCELLED = "appointments.cancelled.v1"
REMINDER = "appointments.reminder.v1"
RESCHEDULED = "appointments.rescheduled.v1"
# A seat freed and went to the first patient of the slot's waitlist who was free.
WAITLIST_BOOKED = "appointments.waitlist_booked.v1"
# A seat freed, but that waiting patient holds another appointment at that time.
WAITLIST_SKIPPED = "appointments.waitlist_skipped.v1"
# The slot's doctor (or an admin) marked a started appointment as missed.
NO_SHOW = "appointments.no_show.v1"
# Drops the cached slot lists a booking, cancellation or move changed (durably:
# what the request could not drop after its commit).
SLOT_LISTS_CONSUMER = "appointments-slot-lists"
SLOT_LIST_CHANGES = (BOOKED, CANCELLED, RESCHEDULED)
TOPICS = (BOOKED, CANCELLED, REMINDER, RESCHEDULED, WAITLIST_BOOKED, WAITLIST_SKIPPED, NO_SHOW)


def payload(appt: Appointment) -> dict[str, Any]:
    seat = skipped_payload(
        appt.slot_id, appt.patient_id, appt.doctor_id, appt.start_at, appt.end_at
    )
    extra = {"overbooked": True} if appt.overbooked else {}
    return {"appointmentId": appt.id, **seat, **extra}


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
