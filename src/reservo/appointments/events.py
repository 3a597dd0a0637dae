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
# Prepaid slots (0054): a seat held until paid, its payment, its end unpaid, and
# the money that goes back (a late or short payment in full, an excess).
HELD = "appointments.appointment.held.v1"
CONFIRMED = "appointments.appointment.payment-confirmed.v1"
EXPIRED = "appointments.appointment.expired.v1"
REFUND_REQUESTED = "appointments.appointment.refund-requested.v1"
# Executes REFUND_REQUESTED through the payment gateway, once per event.
REFUND_CONSUMER = "appointments-refunds"
# Drops the cached slot lists a booking, cancellation or move changed (durably:
# what the request could not drop after its commit).
SLOT_LISTS_CONSUMER = "appointments-slot-lists"
SLOT_LIST_CHANGES = (BOOKED, CANCELLED, RESCHEDULED, HELD, EXPIRED)
TOPICS = (
    BOOKED,
    CANCELLED,
    REMINDER,
    RESCHEDULED,
    WAITLIST_BOOKED,
    WAITLIST_SKIPPED,
    NO_SHOW,
    HELD,
    CONFIRMED,
    EXPIRED,
    REFUND_REQUESTED,
)


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


def held_payload(appt: Appointment) -> dict[str, Any]:
    """A prepaid appointment's events: the seat, its price and, while HELD or
    when it EXPIRED, the hold's end; overpaidRefund once a payment confirmed it."""
    extra: dict[str, Any] = {"price": appt.price_amount, "currency": appt.price_currency}
    if appt.hold_expires_at is not None:
        extra["holdExpiresAt"] = appt.hold_expires_at.isoformat()
    if appt.overpaid_refund is not None:
        extra["overpaidRefund"] = appt.overpaid_refund
    return {**payload(appt), **extra}


def refund_payload(appt: Appointment, amount: int, reason: str) -> dict[str, Any]:
    """What the refund consumer executes: ``amount`` of the appointment's payment
    back to the patient, and why (the notification says it)."""
    return {**held_payload(appt), "amount": amount, "reason": reason}


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
    HELD: (
        "Pay to confirm your appointment at {start}",
        "A place is held for you: appointment #{appointmentId} with doctor #{doctorId} at "
        "{start}. Pay {price} {currency} by {holdEnd} to confirm it; unpaid, it is released.",
    ),
    CONFIRMED: (
        "Appointment paid and confirmed for {start}",
        "Your payment was received: appointment #{appointmentId} with doctor #{doctorId} at "
        "{start} is booked.",
    ),
    EXPIRED: (
        "Appointment at {start} released unpaid",
        "No payment arrived for appointment #{appointmentId} at {start} by {holdEnd}, so "
        "its place was released.",
    ),
    REFUND_REQUESTED: (
        "Refund of {amount} {currency} for your appointment at {start}",
        "{amount} {currency} of your payment for appointment #{appointmentId} at {start} "
        "is being refunded: {reason}.",
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
    if "holdExpiresAt" in p:
        fields["holdEnd"] = _when(p["holdExpiresAt"])
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


_PRICED = {
    **_APPOINTMENT,
    "price": {"type": "integer", "minimum": 1, "description": "The price, in minor units."},
    "currency": {"type": "string", "description": "ISO 4217 code of the price."},
}
_HOLD_END = {"holdExpiresAt": {**_TIME, "description": "When the unpaid hold ends."}}
_PRICED_EXAMPLE = {**_EXAMPLE, "price": 5000, "currency": "EUR"}


def _prepaid_event(
    name: str, summary: str, extra: dict[str, Any], example: dict[str, Any]
) -> EventSpec:
    return EventSpec(
        name=name,
        stream=APPOINTMENT_STREAM,
        summary=summary,
        key="appointment:{firstAppointmentId}",
        key_doc="the first appointment of the reschedule chain: a hold, its payment "
        "or its end, and its refunds in order",
        schema=_schema({**_PRICED, **extra}),
        example={**_PRICED_EXAMPLE, **example},
    )


_HOLD_EXAMPLE = {"holdExpiresAt": "2030-01-01T10:15:00+00:00"}
PREPAID_CONTRACT = (
    _prepaid_event(
        HELD,
        "A patient took a seat of a prepaid slot: HELD (the seat counts) until paid "
        "or its hold ends.",
        _HOLD_END,
        _HOLD_EXAMPLE,
    ),
    _prepaid_event(
        CONFIRMED,
        "The payment of a HELD appointment arrived in time: HELD -> BOOKED. "
        "overpaidRefund: the excess refunded (0: paid exactly).",
        {"overpaidRefund": {"type": "integer", "minimum": 0}},
        {"overpaidRefund": 0},
    ),
    _prepaid_event(
        EXPIRED,
        "A HELD appointment was not paid by its hold's end: EXPIRED, its seat freed.",
        _HOLD_END,
        _HOLD_EXAMPLE,
    ),
    _prepaid_event(
        REFUND_REQUESTED,
        "Money of a prepaid appointment goes back to the patient (executed once by "
        "the refund consumer): a payment after the hold ended or below the price in "
        "full, or the excess of an overpayment.",
        {
            "amount": {"type": "integer", "minimum": 1, "description": "Refunded, minor units."},
            "reason": {"type": "string"},
        },
        {"amount": 5000, "reason": "payment received for an EXPIRED appointment"},
    ),
)

CONTRACT = (
    *PREPAID_CONTRACT,
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
