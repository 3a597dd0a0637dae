"""Input the database could not store is refused by every request model (422)."""

from typing import Any

import pytest
from pydantic import ValidationError

from reservo.core.schemas import ApiModel


class Body(ApiModel):
    payload: dict[str, Any]


@pytest.mark.parametrize(
    "payload",
    [{"a": "x\x00y"}, {"a\x00": 1}, {"n": 2**64}, {"n": -(2**63) - 1}, {"l": [1, {"n": 10**30}]}],
)
def test_unstorable_values_are_refused(payload: dict[str, Any]) -> None:
    with pytest.raises(ValidationError):
        Body(payload=payload)


def test_ordinary_values_pass() -> None:
    body = Body(payload={"n": 2**63 - 1, "m": -(2**63), "t": True, "s": "ok", "f": 1.5})
    assert body.payload["n"] == 2**63 - 1
