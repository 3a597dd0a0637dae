"""Period rentals (cars, rooms, courts): exclusive periods enforced by an
EXCLUDE constraint, holds that expire, idempotent payment webhooks, refunds."""
