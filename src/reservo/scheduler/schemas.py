"""Wire shapes of the Delayed jobs API (camelCase)."""

from __future__ import annotations

from datetime import datetime
from typing import Any, Literal

from pydantic import Field, HttpUrl

from reservo.core.schemas import ApiModel, Instant
from reservo.core.timezones import Zone

MAX_DELAY_MS = 5 * 366 * 24 * 3600 * 1000


class JobIn(ApiModel):
    category: str = Field(min_length=1, max_length=64, pattern=r"^[a-z][a-z0-9._-]{0,63}$")
    urgency: int = Field(default=5, ge=0, le=9, strict=True)
    run_at: Instant | None = None
    delay_ms: int | None = Field(default=None, ge=0, le=MAX_DELAY_MS, strict=True)
    payload: dict[str, Any] = Field(default_factory=dict)


class HttpPayload(ApiModel):
    """Payload of the ``http`` category."""

    url: HttpUrl
    method: Literal["GET", "POST", "PUT", "PATCH", "DELETE"] = "POST"
    headers: dict[str, str] | None = None
    body: Any = None


class JobCreated(ApiModel):
    job_id: int
    status: str
    run_at: datetime


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


class RescheduleIn(ApiModel):
    """PATCH /api/jobs/{jobId}: the new time (a past one means now)."""

    run_at: Instant


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
