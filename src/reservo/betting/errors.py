"""The error codes (with their HTTP status) and constraint names of betting."""

from __future__ import annotations

from reservo.core.kernel.codes import by_status

ERRORS = by_status(
    not_found=["match_not_found", "bet_not_found"],
    conflict=[
        "match_exists",
        "match_closed",
        "odds_changed",
        "market_suspended",
        "match_not_started",
        "not_settled",
        "same_result",
        "already_void",
        "stale_correction",
    ],
)

CONSTRAINTS = {
    "betting_match_external_id": ("match_exists", "a match with this externalId exists"),
    "betting_selection_pkey": ("validation_error", "a bet's selections must be distinct"),
    "betting_match_starts_at_range": (
        "validation_error",
        "startsAt must be within [2000-01-01Z, 2100-01-01Z)",
    ),
}
