"""Base model for the HTTP contract: camelCase on the wire, strict input."""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ConfigDict, model_validator
from pydantic.alias_generators import to_camel


def _unstorable(value: Any) -> str | None:
    """Why a JSON value cannot be stored (PostgreSQL text has no NUL; our JSON codec
    and PostgreSQL bigint stop at 64 bits), or None."""
    if isinstance(value, str):
        return "strings may not contain NUL characters" if "\x00" in value else None
    if isinstance(value, bool):
        return None
    if isinstance(value, int):
        return None if -(2**63) <= value < 2**64 else "integers must fit in 64 bits"
    if isinstance(value, dict):
        for k, v in value.items():
            reason = _unstorable(k) or _unstorable(v)
            if reason:
                return reason
    if isinstance(value, list | tuple):
        for v in value:
            reason = _unstorable(v)
            if reason:
                return reason
    return None


class ApiModel(BaseModel):
    model_config = ConfigDict(
        alias_generator=to_camel,
        populate_by_name=True,
        extra="forbid",
        frozen=True,
        # Money, ids and counts are integers: "10" or 10.0 is refused, not coerced.
        strict=False,
    )

    @model_validator(mode="before")
    @classmethod
    def _no_nul(cls, data: Any) -> Any:
        # Refuse what the database could not store here, as bad input (422), not 500.
        reason = _unstorable(data)
        if reason:
            raise ValueError(reason)
        return data

    def wire(self) -> dict[str, object]:
        return self.model_dump(mode="json", by_alias=True)
