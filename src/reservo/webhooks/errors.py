"""The error codes (with their HTTP status) of outgoing webhooks."""

from __future__ import annotations

from reservo.core.kernel.codes import by_status

ERRORS = by_status(
    not_found=["webhook_endpoint_not_found", "webhook_delivery_not_found"],
    unprocessable=["url_not_allowed", "unknown_event_type"],
)
