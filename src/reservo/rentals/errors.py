"""The error codes (with their HTTP status) of rentals."""

from __future__ import annotations

from reservo.core.kernel.codes import by_status

ERRORS = by_status(
    not_found=["car_not_found", "booking_not_found"],
    conflict=[
        "plate_taken",
        "car_unavailable",
        "invalid_state",
        "pickup_too_early",
        "hold_extended",
        "hold_expired",
    ],
    unavailable=["payment_gateway_unconfigured"],
)

CONSTRAINTS = {
    "uq_car_plate": ("plate_taken", "a car with this plate already exists"),
    "ex_car_period": ("car_unavailable", "this car was just booked for an overlapping period"),
    "fk_payment_booking": ("booking_not_found", "no such booking"),
    "booking_car_id_fkey": ("car_not_found", "no such car"),
}
