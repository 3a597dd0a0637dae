"""Wire shapes of the Delayed jobs API (camelCase)."""

from __future__ import annotations

import re
from datetime import datetime
from typing import Annotated, Any, Literal

from pydantic import AfterValidator, ConfigDict, Field, HttpUrl

from reservo.core.http.schemas import ApiModel, Id, Instant
from reservo.core.kernel.timezones import Zone
from reservo.scheduler import domain
from reservo.scheduler.domain import MAX_AFTER, MAX_RATE, MAX_UNIQUE_KEY, MIN_RATE

MAX_DELAY_MS = 5 * 366 * 24 * 3600 * 1000


# The scheduler's horizon (domain.resolve_run_at), which no schema can say.
RUN_AT = (
    f"When the job runs: at most {domain.MAX_HORIZON.days} days from now (422 beyond); "
    "a past one is due now"
)


class JobIn(ApiModel):
    # The API's rule (scheduler/api.py), for the document: not both.
    model_config = ConfigDict(
        json_schema_extra={
            "not": {
                "required": ["runAt", "delayMs"],
                "properties": {
                    "runAt": {"not": {"type": "null"}},
                    "delayMs": {"not": {"type": "null"}},
                },
            },
            "description": "`runAt` or `delayMs` (not both; neither: now)",
        }
    )

    category: str = Field(min_length=1, max_length=64, pattern=r"^[a-z][a-z0-9._-]{0,63}$")
    urgency: int = Field(default=5, ge=0, le=9, strict=True)
    run_at: Annotated[Instant | None, Field(description=RUN_AT)] = None
    delay_ms: int | None = Field(default=None, ge=0, le=MAX_DELAY_MS, strict=True)
    payload: dict[str, Any] = Field(default_factory=dict)
    unique_key: str | None = Field(
        default=None,
        min_length=1,
        max_length=MAX_UNIQUE_KEY,
        description="While a job of this category with this key has not finished (DONE, DEAD "
        "or CANCELLED), no other is created: the answer is 200 with that job and "
        "`deduplicated: true`.",
    )
    after: list[Id] = Field(
        default_factory=list,
        max_length=MAX_AFTER,
        description="Jobs this one waits for: it is due once every one of them is DONE (and "
        "its own runAt has come); if one ends DEAD or CANCELLED it is CANCELLED with lastError "
        "`dependency_failed`. 422 `unknown_dependency` for an id that is no job.",
    )


# A header name is an RFC 9110 token; a value is visible ASCII with inner spaces
# or tabs (no CR, LF or NUL, which would end the header and start another, and
# no non-ASCII, which the HTTP client refuses to send on every attempt).
_TOKEN = re.compile(r"[!#$%&'*+.^_`|~0-9A-Za-z-]+", re.ASCII)
_VALUE = re.compile(r"(?:[\x21-\x7e](?:[\x20-\x7e\t]*[\x21-\x7e])?)?", re.ASCII)
# Headers a job may not set: the message's framing and the connection's
# (RFC 9110 7.6.1 and 9112), which would let the payload smuggle a second
# request to the destination or contradict the body the client frames; Host,
# which the call sets from the checked URL; Idempotency-Key, which is the job's id.
FORBIDDEN_HEADERS = frozenset(
    {
        "connection",
        "content-length",
        "expect",
        "host",
        "http2-settings",
        "idempotency-key",
        "keep-alive",
        "te",
        "trailer",
        "transfer-encoding",
        "upgrade",
    }
)
MAX_HEADERS = 32


def _headers(headers: dict[str, str] | None) -> dict[str, str] | None:
    for name, value in (headers or {}).items():
        if not _TOKEN.fullmatch(name):
            raise ValueError(f"header name {name!r} is not an HTTP token")
        lower = name.lower()
        if lower in FORBIDDEN_HEADERS or lower.startswith("proxy-"):
            raise ValueError(f"header {name!r} is set by the call itself and may not be given")
        if not _VALUE.fullmatch(value):
            raise ValueError(
                f"header {name!r}: a value is visible ASCII with inner spaces (no CR, LF, "
                "control or non-ASCII characters)"
            )
    return headers


class HttpPayload(ApiModel):
    """Payload of the ``http`` category."""

    url: HttpUrl
    method: Literal["GET", "POST", "PUT", "PATCH", "DELETE"] = "POST"
    headers: Annotated[
        dict[str, Annotated[str, Field(max_length=8192)]] | None,
        Field(max_length=MAX_HEADERS),
        AfterValidator(_headers),
    ] = None
    body: Any = None


class JobCreated(ApiModel):
    """201: the job created; 200 with ``deduplicated`` true: the unfinished job
    that holds the request's ``uniqueKey`` (nothing was created)."""

    job_id: int
    status: str
    run_at: datetime
    deduplicated: bool = False


class JobOut(ApiModel):
    job_id: int
    category: str
    urgency: int
    status: str
    run_at: datetime
    attempts: int
    started_at: datetime | None
    finished_at: datetime | None
    last_error: str | None


class JobPage(ApiModel):
    """A page of GET /api/jobs, newest first; ``next`` is the cursor of the
    following page (pass it as ``after``), null on the last page."""

    items: list[JobOut]
    next: str | None


class JobRescheduleIn(ApiModel):
    """PATCH /api/jobs/{jobId}: the new time (a past one means now)."""

    run_at: Annotated[Instant, Field(description=RUN_AT)]


class RecurringIn(ApiModel):
    """A job created for every occurrence of ``cron`` (5 fields: minute hour
    day-of-month month day-of-week) read in ``timezone`` (an IANA name)."""

    category: str = Field(min_length=1, max_length=64, pattern=r"^[a-z][a-z0-9._-]{0,63}$")
    cron: str = Field(min_length=9, max_length=200, examples=["30 2 * * *"])
    timezone: Zone
    payload: dict[str, Any] = Field(default_factory=dict)
    urgency: int = Field(default=5, ge=0, le=9, strict=True)


class RecurringOut(ApiModel):
    id: int
    category: str
    cron: str
    timezone: str
    next_run_at: datetime | None


class CategoryPaused(ApiModel):
    """POST /api/job-categories/{category}/pause and /resume."""

    category: str
    paused: bool


class RateLimitIn(ApiModel):
    """PUT /api/job-categories/{category}/rate-limit: jobs started per second
    across every worker process; null removes the limit."""

    per_second: float | None = Field(
        ge=MIN_RATE, le=MAX_RATE, allow_inf_nan=False, strict=True, examples=[50]
    )


class RateLimitOut(ApiModel):
    category: str
    per_second: float | None


class CategoryOut(ApiModel):
    """A category's pause, rate limit, and its jobs due now (waiting to run),
    running and dead."""

    category: str
    paused: bool
    per_second: float | None
    due: int
    running: int
    dead: int


class BulkRetryIn(ApiModel):
    """POST /api/jobs/retry: every DEAD job (of ``category`` when given)."""

    status: Literal["DEAD"]
    category: str | None = Field(
        default=None, min_length=1, max_length=64, pattern=r"^[a-z][a-z0-9._-]{0,63}$"
    )


class BulkRetried(ApiModel):
    retried: int
