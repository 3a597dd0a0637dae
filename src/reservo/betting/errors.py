"""The error codes (with their HTTP status) and constraint names of betting."""

from __future__ import annotations

ERRORS = {
    "match_not_found": 404,
    "bet_not_found": 404,
    "match_exists": 409,
    "match_closed": 409,
    "odds_changed": 409,
    "market_suspended": 409,
    "match_not_started": 409,
}

CONSTRAINTS = {
    "betting_match_external_id": ("match_exists", "a match with this externalId exists"),
    "betting_selection_pkey": ("validation_error", "a bet's selections must be distinct"),
    "betting_match_starts_at_range": (
        "validation_error",
        "startsAt must be within [2000-01-01Z, 2100-01-01Z)",
    ),
}
