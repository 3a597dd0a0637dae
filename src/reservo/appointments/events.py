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
TOPICS = (BOOKED, CANCELLED, REMINDER)


def payload(appt: Appointment) -> dict[str, Any]:
    return {
        "appointmentId": appt.id,
        "slotId": appt.slot_id,
        "patientId": appt.patient_id,
        "doctorId": appt.doctor_id,
        "startAt": appt.start_at.isoformat(),
        "endAt": appt.end_at.isoformat(),
    }


def notifications(event: Event) -> list[Notification]:
    p = event.payload
    start = datetime.fromisoformat(p["startAt"]).strftime("%Y-%m-%d %H:%M UTC")
    if event.topic == BOOKED:
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
