"""Input the database could not store is refused by every request model (422)."""

from typing import Any

import pytest
from pydantic import ValidationError

from reservo.core.http.schemas import ApiModel


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


def nested(levels: int) -> dict[str, Any]:
    """A body whose JSON nests ``levels`` deep (the body itself is level 1)."""
    inner: Any = {}
    for i in range(levels - 3):
        inner = [inner] if i % 2 == 0 else {"k": inner}
    return {"payload": {"k": inner}}


@pytest.mark.parametrize("value", [float("nan"), float("inf"), float("-inf")])
def test_non_finite_numbers_are_refused(value: float) -> None:
    with pytest.raises(ValidationError, match="finite"):
        Body(payload={"l": [1, {"x": value}]})


def test_nesting_is_bounded_at_32_levels() -> None:
    assert Body.model_validate(nested(32)).payload is not None
    with pytest.raises(ValidationError, match="nest"):
        Body.model_validate(nested(33))


def test_the_depth_check_itself_cannot_recurse_too_deep() -> None:
    # Far deeper than the interpreter's recursion limit: refused, not RecursionError.
    with pytest.raises(ValidationError, match="nest"):
        Body.model_validate(nested(100_000))
