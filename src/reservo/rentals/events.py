"""Events the rentals module emits, and how each becomes a notification.

Every status change emits one event in the same transaction (outbox); the
refund consumer reacts to REFUND_REQUESTED."""

from __future__ import annotations

from datetime import datetime
from typing import Any

from reservo.core.notify import Notification
from reservo.core.transport.base import Event
from reservo.rentals.domain import Booking

HELD = "rentals.booking.held.v1"
CONFIRMED = "rentals.booking.confirmed.v1"
EXPIRED = "rentals.booking.expired.v1"
CANCELLED = "rentals.booking.cancelled.v1"
PICKED_UP = "rentals.booking.picked-up.v1"
RETURNED = "rentals.booking.returned.v1"
REFUND_REQUESTED = "rentals.refund.requested.v1"
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
    if event.topic == HOLD_EXTENDED:
        body += f" Pay the deposit before {_when(p['holdExpiresAt'])}."
    recipients = [int(p["customerId"])]
    # The host hears about changes that affect the car's calendar.
    if event.topic in (CONFIRMED, CANCELLED) and p["hostId"] != p["customerId"]:
        recipients.append(int(p["hostId"]))
    return [Notification(r, subject, body, str(event.id)) for r in recipients]
