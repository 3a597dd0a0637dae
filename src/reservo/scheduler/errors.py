"""The error codes (with their HTTP status) of the scheduler."""

from __future__ import annotations

ERRORS = {
    "job_not_found": 404,
    "recurring_job_not_found": 404,
    "not_retryable": 409,
    "unknown_category": 422,
    "destination_not_allowed": 422,
}

CONSTRAINTS = {
    "ck_job_run_at_range": (
        "validation_error",
        "run_at is outside the accepted range [2000-01-01T00:00:00Z, 2100-01-01T00:00:00Z)",
    )
}
