"""The error codes (with their HTTP status) of the scheduler."""

from __future__ import annotations

from reservo.core.kernel.codes import by_status

ERRORS = by_status(
    not_found=["job_not_found", "recurring_job_not_found", "category_not_found"],
    conflict=["not_retryable"],
    unprocessable=["unknown_category", "destination_not_allowed", "unknown_dependency"],
)

CONSTRAINTS = {
    "ck_job_run_at_range": (
        "validation_error",
        "run_at is outside the accepted range [2000-01-01T00:00:00Z, 2100-01-01T00:00:00Z)",
    )
}
