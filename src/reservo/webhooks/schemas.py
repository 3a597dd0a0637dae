"""Wire shapes of the outgoing webhooks API (camelCase)."""

from __future__ import annotations

from datetime import datetime
from typing import Literal
from uuid import UUID

from pydantic import Field

from reservo.core.http.schemas import ApiModel

EventType = str
Status = Literal["ENABLED", "DISABLED"]
DeliveryStatus = Literal["PENDING", "DELIVERED", "FAILED"]
MAX_URL = 2000


class EndpointIn(ApiModel):
    url: str = Field(
        min_length=1,
        max_length=MAX_URL,
        description="Where the events are POSTed (http or https): the egress rules of "
        "`http` jobs apply (422 url_not_allowed).",
    )
    events: list[EventType] = Field(
        min_length=1,
        max_length=200,
        description="Event types, the AsyncAPI document's "
        "(e.g. appointments.appointment.booked.v1).",
    )
    description: str = Field(default="", max_length=500)


class EndpointPatch(ApiModel):
    events: list[EventType] | None = Field(default=None, min_length=1, max_length=200)
    description: str | None = Field(default=None, max_length=500)
    status: Status | None = None


class EndpointOut(ApiModel):
    id: int
    url: str
    events: list[str]
    description: str
    status: Status
    created_at: datetime


class EndpointCreated(EndpointOut):
    secret: str = Field(
        description="The signing secret (whsec_...): shown here and at rotation only."
    )


class SecretOut(ApiModel):
    secret: str = Field(
        description="The new signing secret; the previous one keeps signing too for 24 h."
    )


class DeliveryOut(ApiModel):
    id: int
    event_id: UUID
    event_type: str
    status: DeliveryStatus
    attempts: int
    last_status_code: int | None
    last_error: str | None
    next_attempt_at: datetime | None
    delivered_at: datetime | None
