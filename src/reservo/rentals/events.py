"""Events the rentals module emits, and how each becomes a notification.

Every status change emits one event in the same transaction (outbox); the
refund consumer reacts to REFUND_REQUESTED."""

from __future__ import annotations

from datetime import datetime
from typing import Any

from reservo.core.kernel.contract import EventSpec
from reservo.core.messaging.notify import Notification
from reservo.core.messaging.transport.base import Event
from reservo.rentals.domain import Booking

# A booking's whole life (hold, payment, trip, refund) on one stream, one key.
STREAM = "rentals.booking.v1"
HELD = "rentals.booking.held.v1"
CONFIRMED = "rentals.booking.confirmed.v1"
EXPIRED = "rentals.booking.expired.v1"
CANCELLED = "rentals.booking.cancelled.v1"
PICKED_UP = "rentals.booking.picked-up.v1"
RETURNED = "rentals.booking.returned.v1"
REFUND_REQUESTED = "rentals.booking.refund-requested.v1"
# Not a status change: a HOLD's expiry moved (its one extension).
HOLD_EXTENDED = "rentals.booking.hold-extended.v1"
STATUS_TOPICS = (HELD, CONFIRMED, EXPIRED, CANCELLED, PICKED_UP, RETURNED)
TOPICS = (*STATUS_TOPICS, HOLD_EXTENDED, REFUND_REQUESTED)
BY_STATUS = {
    "HOLD": HELD,
    "CONFIRMED": CONFIRMED,
    "EXPIRED": EXPIRED,
    "CANCELLED": CANCELLED,
    "ON_TRIP": PICKED_UP,
    "COMPLETED": RETURNED,
}
REFUND_CONSUMER = "rentals-refunds"


def key(booking_id: int) -> str:
    """One aggregate, one key: a booking's events are delivered in order."""
    return f"booking:{booking_id}"


def payload(b: Booking) -> dict[str, Any]:
    return {
        "bookingId": b.id,
        "carId": b.car_id,
        "customerId": b.customer_id,
        "hostId": b.host_id,
        "status": b.status,
        "from": b.from_at.isoformat(),
        "to": b.return_at.isoformat(),
        "depositAmount": b.deposit_amount,
        "refundAmount": b.refund_amount,
        "overpaidRefund": b.overpaid_refund,
    }


def extended_payload(b: Booking) -> dict[str, Any]:
    """A status event's payload plus the new expiry."""
    assert b.hold_expires_at is not None  # an extended booking is a live HOLD
    return {**payload(b), "holdExpiresAt": b.hold_expires_at.isoformat()}


def refund_payload(b: Booking, amount: int, reason: str) -> dict[str, Any]:
    return {
        "bookingId": b.id,
        "customerId": b.customer_id,
        "amount": amount,
        "reason": reason,
    }


_SUBJECTS = {
    HELD: "Car #{carId} held for you: pay the deposit to confirm",
    CONFIRMED: "Booking #{bookingId} confirmed",
    EXPIRED: "Booking #{bookingId} expired: the deposit was not paid in time",
    CANCELLED: "Booking #{bookingId} cancelled",
    PICKED_UP: "Booking #{bookingId}: trip started",
    RETURNED: "Booking #{bookingId}: car returned, trip completed",
    HOLD_EXTENDED: "Booking #{bookingId}: your hold was extended",
}


def _when(iso: str) -> str:
    return datetime.fromisoformat(iso).strftime("%Y-%m-%d %H:%M UTC")


def notifications(event: Event) -> list[Notification]:
    p = event.payload
    if event.topic == REFUND_REQUESTED:
        return [
            Notification(
                int(p["customerId"]),
                f"Refund of {p['amount']} for booking #{p['bookingId']}",
                f"A refund of {p['amount']} (minor units) is on its way ({p['reason']}).",
                str(event.id),
            )
        ]
    subject = _SUBJECTS[event.topic].format(**p)
    body = (
        f"Booking #{p['bookingId']} of car #{p['carId']}, {_when(p['from'])} to "
        f"{_when(p['to'])}, is now {p['status']}."
    )
    if event.topic == CANCELLED and p.get("refundAmount"):
        body += f" Refund: {p['refundAmount']} (minor units)."
    if event.topic == CONFIRMED and p.get("overpaidRefund"):
        body += (
            f" You paid {p['overpaidRefund']} (minor units) more than the deposit: it goes back."
        )
    if event.topic == HOLD_EXTENDED:
        body += f" Pay the deposit before {_when(p['holdExpiresAt'])}."
    recipients = [int(p["customerId"])]
    # The host hears about changes that affect the car's calendar.
    if event.topic in (CONFIRMED, CANCELLED) and p["hostId"] != p["customerId"]:
        recipients.append(int(p["hostId"]))
    return [Notification(r, subject, body, str(event.id)) for r in recipients]


# -- the contract (core/kernel/contract.py): what a subscriber may rely on ---------------

_ID = {"type": "integer", "minimum": 1}
_MONEY = {"type": "integer", "minimum": 0, "description": "Minor units."}
_TIME = {"type": "string", "format": "date-time"}
_BOOKING_SCHEMA: dict[str, Any] = {
    "type": "object",
    "required": [
        "bookingId",
        "carId",
        "customerId",
        "hostId",
        "status",
        "from",
        "to",
        "depositAmount",
        "refundAmount",
    ],
    "properties": {
        "bookingId": _ID,
        "carId": _ID,
        "customerId": _ID,
        "hostId": _ID,
        "status": {"enum": sorted(BY_STATUS)},
        "from": _TIME,
        "to": _TIME,
        "depositAmount": _MONEY,
        "refundAmount": {**_MONEY, "type": ["integer", "null"]},
        # Not required: events written before it existed (0051) do not carry it.
        "overpaidRefund": {
            **_MONEY,
            "type": ["integer", "null"],
            "description": "Minor units: the excess of the payment that confirmed the "
            "booking, returned by its own refund-requested event (0: paid exactly); "
            "null while no payment confirmed it.",
        },
    },
    "additionalProperties": True,
}
_BOOKING_EXAMPLE = {
    "bookingId": 12,
    "carId": 5,
    "customerId": 2001,
    "hostId": 2002,
    "status": "HOLD",
    "from": "2030-01-07T10:00:00+00:00",
    "to": "2030-01-09T10:00:00+00:00",
    "depositAmount": 15000,
    "refundAmount": None,
    "overpaidRefund": None,
}
_KEY_DOC = "the booking: its whole life (hold, payment, trip, refunds) in order"
_SUMMARIES = {
    HELD: "A car was held for a customer; the deposit is due.",
    CONFIRMED: "The deposit was paid: the booking is confirmed (overpaidRefund: the "
    "excess of a payment above the deposit, which goes back).",
    EXPIRED: "The hold lapsed unpaid.",
    CANCELLED: "The booking was cancelled (refundAmount: what goes back).",
    PICKED_UP: "The trip started.",
    RETURNED: "The car came back: the trip is completed.",
}


# A confirmed booking whose payment was 500 above its deposit.
_EXAMPLE_OF: dict[str, dict[str, Any]] = {"CONFIRMED": {"overpaidRefund": 500}}


def _status_event(status: str, name: str) -> EventSpec:
    return EventSpec(
        name=name,
        stream=STREAM,
        summary=_SUMMARIES[name],
        key="booking:{bookingId}",
        key_doc=_KEY_DOC,
        schema=_BOOKING_SCHEMA,
        example={**_BOOKING_EXAMPLE, "status": status, **_EXAMPLE_OF.get(status, {})},
    )


CONTRACT = (
    *(_status_event(status, name) for status, name in BY_STATUS.items()),
    EventSpec(
        name=HOLD_EXTENDED,
        stream=STREAM,
        summary="The customer extended the HOLD once: holdExpiresAt is the new deadline.",
        key="booking:{bookingId}",
        key_doc=_KEY_DOC,
        schema={
            **_BOOKING_SCHEMA,
            "required": [*_BOOKING_SCHEMA["required"], "holdExpiresAt"],
            "properties": {**_BOOKING_SCHEMA["properties"], "holdExpiresAt": _TIME},
        },
        example={
            **_BOOKING_EXAMPLE,
            "holdExpiresAt": "2030-01-01T12:30:00+00:00",
        },
    ),
    EventSpec(
        name=REFUND_REQUESTED,
        stream=STREAM,
        summary="Money goes back to the customer (a cancel, or a payment that came "
        "late or too large); the refund consumer pays it.",
        key="booking:{bookingId}",
        key_doc=_KEY_DOC,
        schema={
            "type": "object",
            "required": ["bookingId", "customerId", "amount", "reason"],
            "properties": {
                "bookingId": _ID,
                "customerId": _ID,
                "amount": {**_MONEY, "minimum": 1},
                "reason": {"type": "string"},
            },
            "additionalProperties": True,
        },
        example={
            "bookingId": 12,
            "customerId": 2001,
            "amount": 15000,
            "reason": "cancelled by the customer",
        },
        formerly=("rentals.refund.requested.v1",),
    ),
)
