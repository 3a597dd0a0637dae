"""Pure rules of outgoing webhooks: secrets, Standard Webhooks signatures, and
when a failed delivery is tried again, given up or its endpoint disabled."""

from __future__ import annotations

import base64
import hashlib
import hmac
import secrets
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any
from uuid import UUID

from reservo.core.aio.backoff import backoff_delay
from reservo.core.db.rows import FromRow

ENABLED, DISABLED = "ENABLED", "DISABLED"
PENDING, DELIVERED, FAILED = "PENDING", "DELIVERED", "FAILED"
DELIVERY_STATUSES = (PENDING, DELIVERED, FAILED)
SECRET_PREFIX = "whsec_"
SECRET_BYTES = 32
# The previous secret keeps signing this long after a rotation, so a subscriber
# can switch its verifier at its own pace.
ROTATION_GRACE = timedelta(hours=24)
# An endpoint whose every attempt failed for this long is disabled.
DISABLE_AFTER = timedelta(days=5)
# What the deliveries list keeps of a subscriber's answer or failure.
ERROR_TEXT_MAX = 500


def new_secret() -> str:
    """A signing secret in the Standard Webhooks form: ``whsec_`` + base64 key."""
    return SECRET_PREFIX + base64.b64encode(secrets.token_bytes(SECRET_BYTES)).decode()


def signature(secret: str, msg_id: str, timestamp: int, body: bytes) -> str:
    """``v1,<base64 HMAC-SHA256 of "id.timestamp.body">`` under the secret's key."""
    key = base64.b64decode(secret.removeprefix(SECRET_PREFIX))
    mac = hmac.new(key, f"{msg_id}.{timestamp}.".encode() + body, hashlib.sha256).digest()
    return "v1," + base64.b64encode(mac).decode()


def headers(msg_id: str, timestamp: int, body: bytes, signing: Sequence[str]) -> dict[str, str]:
    """The Standard Webhooks headers: one signature per secret still signing,
    space-separated (a verifier accepts the message if any one matches)."""
    return {
        "webhook-id": msg_id,
        "webhook-timestamp": str(timestamp),
        "webhook-signature": " ".join(signature(s, msg_id, timestamp, body) for s in signing),
        "content-type": "application/json",
    }


@dataclass(frozen=True)
class Endpoint(FromRow):
    id: int
    url: str
    events: list[str]
    description: str
    status: str
    secret: str
    previous_secret: str | None
    previous_until: datetime | None
    failing_since: datetime | None
    created_at: datetime

    def signing_secrets(self, now: datetime) -> list[str]:
        return signing_secrets(self.secret, self.previous_secret, self.previous_until, now)


def signing_secrets(
    secret: str, previous: str | None, previous_until: datetime | None, now: datetime
) -> list[str]:
    """The current secret, and the previous one within its grace."""
    if previous and previous_until and now < previous_until:
        return [secret, previous]
    return [secret]


@dataclass(frozen=True)
class Delivery(FromRow):
    id: int
    endpoint_id: int
    event_id: UUID
    event_type: str
    status: str
    attempts: int
    turn: int
    last_status_code: int | None
    last_error: str | None
    next_attempt_at: datetime | None
    retry_until: datetime
    delivered_at: datetime | None
    created_at: datetime


@dataclass(frozen=True)
class Outcome:
    """What one attempt came to: a 2xx, or why not (status code or error)."""

    ok: bool
    status_code: int | None = None
    error: str | None = None


@dataclass(frozen=True)
class Retries:
    """How failed attempts are retried: backoff from ``base_s`` doubling up to
    ``max_s``, for ``window`` from the event (or from a redelivery)."""

    base_s: float
    max_s: float
    window: timedelta


def next_attempt(
    attempts: int, now: datetime, retry_until: datetime, retries: Retries
) -> datetime | None:
    """When to try again after the ``attempts``-th failed attempt (exponential,
    with jitter so the retries of many deliveries spread out), or None when
    that would be past ``retry_until``: the delivery has FAILED."""
    at = now + timedelta(seconds=backoff_delay(attempts, retries.base_s, retries.max_s))
    return at if at <= retry_until else None


def should_disable(failing_since: datetime | None, now: datetime) -> bool:
    return failing_since is not None and now - failing_since >= DISABLE_AFTER


def unknown_types(wanted: Sequence[str], known: set[str]) -> list[str]:
    return sorted({t for t in wanted if t not in known})


def payload(delivery_id: int, turn: int, endpoint_id: int) -> dict[str, Any]:
    """A delivery job's payload: which delivery, which of its turns, and the
    endpoint (its share of attempts is checked before anything is read)."""
    return {"deliveryId": delivery_id, "turn": turn, "endpointId": endpoint_id}
