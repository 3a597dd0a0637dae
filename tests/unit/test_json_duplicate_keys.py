"""read_json refuses an object naming a key twice (DuplicateKey), at any depth and
however the body is spelled, and never refuses a body that does not: its quick
count of key ends may only send a body to the second, exact reading."""

from __future__ import annotations

import json
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from reservo.core.http.schemas import DuplicateKey, JsonRefused, read_json


@pytest.mark.parametrize(
    ("raw", "key"),
    [
        (b'{"amount": 1, "amount": 100000000}', "amount"),
        (b'{"a":{"b":1,"b":2}}', "b"),
        (b'[{"x":1},{"x":1,"y":{"x":2,"x":3}}]', "x"),
        (b'{"a" : 1 ,\n "a"\t:2}', "a"),
        (b'{"\\u0061":1,"a":2}', "a"),  # the same key once its escape is read
        (b'{"":1,"":2}', ""),
    ],
)
def test_a_key_twice_is_refused(raw: bytes, key: str) -> None:
    with pytest.raises(DuplicateKey) as refused:
        read_json(raw)
    assert refused.value.key == key


@pytest.mark.parametrize(
    "raw",
    [
        b'{"a":":","b":"\\":","c":"\\" :"}',  # key ends inside strings: counted, not keys
        b'{"a":1,"A":2,"a ":3}',
        b'[{"a":1},{"a":1}]',  # one key in two objects
        b'{"a":{"a":{"a":1}}}',
        b'{\n  "a": 1,\n  "b": [\n    "x"\n  ]\n}',
    ],
)
def test_distinct_keys_are_read(raw: bytes) -> None:
    assert read_json(raw) == json.loads(raw)


# Text the other rules accept (no NUL, no lone surrogate): only keys are at stake.
TEXT = st.characters(min_codepoint=1, max_codepoint=0xD7FF) | st.characters(min_codepoint=0xE000)
KEYS = st.text(TEXT, max_size=4)
VALUES = st.recursive(
    st.none() | st.integers(-(2**63), 2**63) | st.text(TEXT, max_size=6),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(KEYS, inner, max_size=3),
    max_leaves=12,
)
SPELLINGS = st.sampled_from([{}, {"indent": 2}, {"separators": (",", ":")}, {"indent": "\t"}])


@settings(max_examples=300, deadline=None, database=None, derandomize=True)
@given(value=VALUES, spelling=SPELLINGS)
def test_what_an_encoder_writes_is_read_back(value: Any, spelling: dict[str, Any]) -> None:
    raw = json.dumps(value, **spelling).encode()
    assert read_json(raw) == value


@settings(max_examples=300, deadline=None, database=None, derandomize=True)
@given(
    obj=st.dictionaries(KEYS, VALUES, min_size=1, max_size=4), value=VALUES, depth=st.integers(0, 3)
)
def test_a_key_written_twice_at_any_depth_is_refused(
    obj: dict[str, Any], value: Any, depth: int
) -> None:
    first = next(iter(obj))
    twice = b"{" + json.dumps(first).encode() + b":" + json.dumps(value).encode() + b","
    raw = twice + json.dumps(obj).encode()[1:]
    for _ in range(depth):
        raw = b'{"outer":[1,' + raw + b"]}"
    with pytest.raises(JsonRefused) as refused:
        read_json(raw)
    assert isinstance(refused.value, DuplicateKey) and refused.value.key == first
