"""Schemathesis hooks (loaded through SCHEMATHESIS_HOOKS by the fuzz test): besides
the bodies the schema describes, send the shapes a black-box probe used against
reservo: one field of a generated body replaced by an absurd instant, a value
nested far deeper than JSON needs, an integer past 64 bits, digits of another
script, a NUL. None may be a 5xx. And the two things a real client does that the
generator does not: a fresh Idempotency-Key per request, integers without a
fraction. (NaN and Infinity are not
JSON: the fuzzer's client refuses to send them, so tests/integration/
test_security_auth.py sends them as raw bytes.)"""

from __future__ import annotations

import copy
import random
import re
import sys
import uuid
from typing import Any

import schemathesis
from hypothesis.internal import lambda_sources

# What the service takes as an Idempotency-Key (core/http/idempotency.py).
_KEY = re.compile(r"[\x21-\x7e]{1,255}")


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
    _deep(100),  # past the 32 levels a body may have (the tool copies deeper ones badly)
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


# Seeded: the same run of the fuzz test injects the same shapes.
_rng = random.Random(7)
# Hypothesis names a recursive strategy (a free-form object: a job's payload) by
# parsing its lambdas' source; drawn deep in the recursion, CPython 3.11's parser
# failed there ("SystemError: AST constructor recursion depth mismatch"), a
# runtime error of the tool, not an answer of the service. Room for it:
sys.setrecursionlimit(max(sys.getrecursionlimit(), 5000))
# and, where the parser still fails (the patient run of seed 7 did), the name a
# message would show falls back to hypothesis' own "unknown" form: the name is
# only ever printed, never used to draw.
_describe = lambda_sources._lambda_description


def _described_or_unknown(f: Any, *args: Any, **kwargs: Any) -> str:
    try:
        return str(_describe(f, *args, **kwargs))
    except SystemError:
        return "lambda: <unknown>"


lambda_sources._lambda_description = _described_or_unknown


@schemathesis.hook
def map_case(context: Any, case: Any) -> Any:
    """Every other case with a JSON object body gets one hostile shape. The tool
    validates a changed body against the schema again, so the case counts as
    positive data when the shape is one the document allows (a date as a
    doctor's name: it must be taken) and as negative data when it is not (an
    integer past 64 bits: it must be refused); no 5xx either way."""
    if isinstance(case.body, dict) and case.body and _rng.random() < 0.5:
        case.body = _inject(copy.deepcopy(case.body), _rng.choice(HOSTILE), _rng.randrange(64))
    _fresh_idempotency_key(case)
    _whole_floats_as_integers(case)
    return case


def _fresh_idempotency_key(case: Any) -> None:
    """A well-formed Idempotency-Key made unique to its request. The generator draws
    few distinct keys (``!`` again and again) for different bodies, and the
    service rightly answers a key reused with another body 422
    ``idempotency_key_reused``: a client never does that. A malformed key (a
    negative case) is kept, its 400 is what is tested."""
    headers = case.headers or {}
    for name, value in headers.items():
        if name.lower() == "idempotency-key" and _KEY.fullmatch(str(value)):
            headers[name] = f"fuzz-{uuid.uuid4()}"


def _whole_floats_as_integers(case: Any) -> None:
    """1584.0 is an `integer` to JSON Schema, and the generator sends it as one;
    reservo's integers (ids, money, counts) are written without a fraction, 10.0
    is refused rather than coerced, which JSON Schema cannot say. Positive data
    only: a negative case's floats are the point of it."""
    meta = case.meta
    if meta is None or not meta.generation.mode.is_positive:
        return
    case.body = _integral(case.body)


def _integral(value: Any) -> Any:
    if isinstance(value, float) and value.is_integer():
        return int(value)
    if isinstance(value, dict):
        return {k: _integral(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_integral(v) for v in value]
    return value
