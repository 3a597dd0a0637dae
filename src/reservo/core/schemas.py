"""Base model for the HTTP contract: camelCase on the wire, strict input."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict
from pydantic.alias_generators import to_camel


class ApiModel(BaseModel):
    model_config = ConfigDict(
        alias_generator=to_camel,
        populate_by_name=True,
        extra="forbid",
        frozen=True,
        # Money, ids and counts are integers: "10" or 10.0 is refused, not coerced.
        strict=False,
    )

    def wire(self) -> dict[str, object]:
        return self.model_dump(mode="json", by_alias=True)
