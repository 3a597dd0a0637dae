"""Wire shapes of the Operations API."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import Annotated

from pydantic import Field, with_config

from reservo.core.http.schemas import ApiModel
from reservo.core.messaging.deadletters import DeadLetter


# A dead letter on the wire: the letter itself, its fields in camelCase, but for
# when it was parked, which the API has always called ``createdAt``. Only ever
# answered (never parsed), so it is the dataclass rather than a model restating it.
@with_config(ApiModel.model_config)
@dataclass(frozen=True)
class DeadLetterOut(DeadLetter):
    parked_at: Annotated[datetime, Field(alias="createdAt")]


class DeadLetterPage(ApiModel):
    items: list[DeadLetterOut]
    next: str | None


class Replayed(ApiModel):
    replayed: bool
