"""The error codes (with their HTTP status) and constraint names of appointments."""

from __future__ import annotations

from reservo.core.kernel.codes import by_status

ERRORS = by_status(
    not_found=[
        "doctor_not_found",
        "slot_not_found",
        "appointment_not_found",
        "not_waiting",
        # A calendar feed's URL that is malformed, unknown or replaced by a newer link.
        "calendar_not_found",
        "series_not_found",
    ],
    # A Web Push endpoint the egress rules of `http` jobs refuse (as the scheduler's).
    unprocessable=["destination_not_allowed"],
    conflict=[
        "slot_full",
        "already_booked",
        "patient_busy",
        "slot_in_past",
        "slot_not_open",
        "not_reschedulable",
        "slot_available",
        "already_waiting",
        # The doctor's stored zone breaks the zone rule (written before it).
        "unknown_timezone",
        # Third release: staff overbooking and no-shows.
        "overbook_limit",
        "no_show_limit",
        "not_started",
        "not_booked",
        # Prepaid appointments: a payment or cancel of an appointment that is
        # not (or never was) held.
        "not_held",
        # Fourth release: a schedule's booking rules (minimum notice, daily limit).
        "too_late_to_book",
        "daily_limit",
    ],
    # A refund event waits (and is retried) while no payment gateway is set.
    unavailable=["payment_gateway_unconfigured"],
)

CONSTRAINTS = {
    "uq_active_patient_slot": ("already_booked", "you already hold a booking in this slot"),
    "ex_patient_overlap": (
        "patient_busy",
        "you already hold a booking that overlaps this slot's time",
    ),
    "uq_waitlist_slot_patient": ("already_waiting", "you are already waiting for this slot"),
}
