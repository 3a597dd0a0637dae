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
# Drops the cached slot lists a booking, cancellation or move changed (durably:
# what the request could not drop after its commit).
SLOT_LISTS_CONSUMER = "appointments-slot-lists"
SLOT_LIST_CHANGES = (BOOKED, CANCELLED, RESCHEDULED)
TOPICS = (BOOKED, CANCELLED, REMINDER, RESCHEDULED, WAITLIST_BOOKED, WAITLIST_SKIPPED)


def payload(appt: Appointment) -> dict[str, Any]:
    return {
        "appointmentId": appt.id,
        "slotId": appt.slot_id,
        "patientId": appt.patient_id,
        "doctorId": appt.doctor_id,
        "startAt": appt.start_at.isoformat(),
        "endAt": appt.end_at.isoformat(),
    }


def rescheduled_payload(appt: Appointment, old: Appointment) -> dict[str, Any]:
    return {**payload(appt), "rescheduledFrom": old.id, "previousStartAt": old.start_at.isoformat()}


def skipped_payload(
    slot_id: int, patient_id: int, doctor_id: int, start_at: datetime, end_at: datetime
) -> dict[str, Any]:
    return {
        "slotId": slot_id,
        "patientId": patient_id,
        "doctorId": doctor_id,
        "startAt": start_at.isoformat(),
        "endAt": end_at.isoformat(),
    }


def _when(iso: str) -> str:
    return datetime.fromisoformat(iso).strftime("%Y-%m-%d %H:%M UTC")


def notifications(event: Event) -> list[Notification]:
    p = event.payload
    start = _when(p["startAt"])
    if event.topic == RESCHEDULED:
        subject = f"Appointment moved to {start}"
        body = (
            f"Your appointment #{p['rescheduledFrom']} at {_when(p['previousStartAt'])} "
            f"was moved: appointment #{p['appointmentId']} with doctor #{p['doctorId']} "
            f"at {start} is booked."
        )
    elif event.topic == WAITLIST_BOOKED:
        subject = f"A place freed up: appointment booked for {start}"
        body = (
            f"A place freed up in the slot you were waiting for: appointment "
            f"#{p['appointmentId']} with doctor #{p['doctorId']} at {start} is booked for you."
        )
    elif event.topic == WAITLIST_SKIPPED:
        subject = f"A place freed up at {start}, but you are busy then"
        body = (
            f"A place freed up in slot #{p['slotId']} with doctor #{p['doctorId']} at "
            f"{start}, but you hold another appointment at that time, so it went to the "
            f"next patient and you left that waitlist."
        )
    elif event.topic == BOOKED:
        subject = f"Appointment confirmed for {start}"
        body = (
            f"Your appointment #{p['appointmentId']} with doctor #{p['doctorId']} "
            f"at {start} is booked."
        )
    elif event.topic == REMINDER:
        subject = f"Reminder: appointment at {start}"
        body = (
            f"Your appointment #{p['appointmentId']} with doctor #{p['doctorId']} "
            f"is tomorrow at {start}."
        )
    else:
        subject = f"Appointment for {start} cancelled"
        body = f"Your appointment #{p['appointmentId']} at {start} was cancelled."
    return [Notification(int(p["patientId"]), subject, body, str(event.id))]
