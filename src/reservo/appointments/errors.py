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
}

CONSTRAINTS = {
    "uq_active_patient_slot": ("already_booked", "you already hold a booking in this slot"),
    "ex_patient_overlap": (
        "patient_busy",
        "you already hold a booking that overlaps this slot's time",
    ),
}
