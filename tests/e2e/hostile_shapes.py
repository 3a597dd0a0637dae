"""Schemathesis hooks (loaded through SCHEMATHESIS_HOOKS by the fuzz test): besides
the bodies the schema describes, send the shapes a black-box probe used against
reservo: one field of a generated body replaced by an absurd instant, a value
nested far deeper than JSON needs, an integer past 64 bits, digits of another
script, a NUL. Every one must be a 4xx, never a 5xx. (NaN and Infinity are not
JSON: the fuzzer's client refuses to send them, so tests/integration/
test_security_auth.py sends them as raw bytes.)"""

from __future__ import annotations

from typing import Any

import schemathesis
from hypothesis import strategies as st


def _deep(levels: int) -> Any:
    value: Any = 1
    for i in range(levels):
        value = {"n": value} if i % 2 else [value]
    return value


HOSTILE: list[Any] = [
    "0001-01-01T00:00:00+05:00",  # year 0 once in UTC
    "0001-01-01T00:00:00Z",
    "9999-12-31T23:59:59-12:00",
    "1900-01-01",
    2**70,
    -(2**70),
    _deep(300),
    "\u0661\u0660",  # Arabic-Indic "10"
    "\x00",
]


def _inject(body: Any, value: Any, index: int) -> Any:
    """``body`` with its ``index``-th field (modulo the number of fields, nested
    objects included) set to ``value``."""
    if not isinstance(body, dict) or not body:
        return body
    paths: list[tuple[dict[str, Any], str]] = []

    def walk(node: dict[str, Any]) -> None:
        for key, child in node.items():
            paths.append((node, key))
            if isinstance(child, dict):
                walk(child)
            elif isinstance(child, list):
                for item in child:
                    if isinstance(item, dict):
                        walk(item)

    walk(body)
    node, key = paths[index % len(paths)]
    node[key] = value
    return body


@schemathesis.hook
def before_generate_body(context: Any, strategy: st.SearchStrategy[Any]) -> Any:
    hostile = st.tuples(strategy, st.sampled_from(HOSTILE), st.integers(0, 63)).map(
        lambda t: _inject(t[0], t[1], t[2])
    )
    return st.one_of(strategy, hostile)
