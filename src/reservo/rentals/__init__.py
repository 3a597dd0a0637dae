"""Period rentals (cars, rooms, courts): exclusive periods enforced by an
EXCLUDE constraint, holds that expire, idempotent payment webhooks, refunds.

The public facade other modules and the console use; they never import the
module's files."""

from reservo.rentals.domain import BlockedPeriod, Booking
from reservo.rentals.gateway import PaymentGateway, build_gateway
from reservo.rentals.schemas import BookingStatus
from reservo.rentals.service import RentalService

__all__ = [
    "BlockedPeriod",
    "Booking",
    "BookingStatus",
    "PaymentGateway",
    "RentalService",
    "build_gateway",
]
