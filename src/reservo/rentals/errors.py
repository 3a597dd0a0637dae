"""The error codes (with their HTTP status) of rentals."""

from __future__ import annotations

ERRORS = {
    "plate_taken": 409,
    "car_not_found": 404,
    "car_unavailable": 409,
    "booking_not_found": 404,
    "invalid_state": 409,
    "payment_gateway_unconfigured": 503,
}

CONSTRAINTS = {
    "uq_car_plate": ("plate_taken", "a car with this plate already exists"),
    "ex_car_period": ("car_unavailable", "this car was just booked for an overlapping period"),
    "fk_payment_booking": ("booking_not_found", "no such booking"),
    "booking_car_id_fkey": ("car_not_found", "no such car"),
}
