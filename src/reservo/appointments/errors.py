"""The error codes (with their HTTP status) and constraint names of appointments."""

from __future__ import annotations

ERRORS = {
    "doctor_not_found": 404,
    "slot_not_found": 404,
    "appointment_not_found": 404,
    "slot_full": 409,
    "already_booked": 409,
    "patient_busy": 409,
    "slot_in_past": 409,
    "slot_not_open": 409,
    "not_reschedulable": 409,
    "slot_available": 409,
    "already_waiting": 409,
    "not_waiting": 404,
}

CONSTRAINTS = {
    "uq_active_patient_slot": ("already_booked", "you already hold a booking in this slot"),
    "ex_patient_overlap": (
        "patient_busy",
        "you already hold a booking that overlaps this slot's time",
    ),
    "uq_waitlist_slot_patient": ("already_waiting", "you are already waiting for this slot"),
}
