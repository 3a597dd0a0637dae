"""Wire shapes of the Operations API."""

from __future__ import annotations

from datetime import datetime
from uuid import UUID

from reservo.core.schemas import ApiModel


class DeadLetterOut(ApiModel):
    id: int
    consumer: str
    topic: str
    event_id: UUID | None
    error: str
    attempts: int
    created_at: datetime
    replayed_at: datetime | None


class DeadLetterPage(ApiModel):
    items: list[DeadLetterOut]
    next: str | None


class Replayed(ApiModel):
    replayed: bool
