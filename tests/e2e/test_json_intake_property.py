"""Property: random bytes and random JSON (lone surrogates, integers far past 64
bits, NaN and Infinity, NUL, nesting far past 32 levels) sent to EVERY JSON intake
of a real `reservo api` process (every POST, PUT and PATCH of its OpenAPI document,
with an admin token, which every role check admits) are answered, never with a
5xx and never with a dropped connection; a body the intake rules refuse
(core.http.schemas.read_json) is 422 whatever the route: `duplicate_key` for an
object that names a key twice, `validation_error` for any other rule."""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from typing import Any

import httpx
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from reservo.core.http.schemas import DuplicateKey, JsonRefused, read_json
from reservo.settings import Settings
from tests.helpers.auth import token
from tests.helpers.procs import env_for, free_port, running, wait_http

WRITES = ("post", "put", "patch")
# The whole property, server start included, stays well within a minute.
BUDGET_S = 40.0

ODD_STRINGS = st.sampled_from(["\ud800", "\udfff", "a\ud800b", "\x00", "a\x00", "\u0661\u0660"])
SCALARS = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(min_value=-(2**80), max_value=2**80),
    st.sampled_from([2**63, 2**64, -(2**63) - 1, 10**40]),
    st.floats(allow_nan=True, allow_infinity=True),
    st.text(max_size=12),
    ODD_STRINGS,
)
KEYS = st.one_of(st.text(max_size=8), ODD_STRINGS)
VALUES = st.recursive(
    SCALARS,
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(KEYS, inner, max_size=4),
    max_leaves=16,
)


def _render(value: Any) -> bytes:
    # The standard library writes what orjson will not: lone surrogates as
    # \ud800 escapes, NaN and Infinity, integers of any size.
    return json.dumps(value, ensure_ascii=True, allow_nan=True).encode()


def _deep(levels: int, obj: bool) -> bytes:
    opened, closed = ('{"a":', "}") if obj else ("[", "]")
    return (opened * levels + "1" + closed * levels).encode()


def _key_twice(obj: dict[str, Any], value: Any) -> bytes:
    """``obj`` with its first key written once more, in front, with ``value``."""
    first = next(iter(obj))
    return b"{" + _render(first) + b":" + _render(value) + b"," + _render(obj)[1:]


OBJECTS = st.dictionaries(st.text(max_size=8), VALUES, min_size=1, max_size=6)
BODIES = st.one_of(
    st.binary(max_size=256),
    VALUES.map(_render),
    OBJECTS.map(_render),
    st.builds(_deep, st.integers(30, 3000), st.booleans()),
    st.builds(_key_twice, OBJECTS, VALUES),
)

# Free-form fields inside otherwise valid bodies: the values must reach the
# fields no model types (a job's payload) to show they hold to the rules too.
_HTTP_JOB = {"category": "http", "runAt": "2099-01-01T00:00:00Z"}
_RECURRING = {"category": "http", "cron": "0 3 * * *", "timezone": "UTC"}
_MARK = "\x00mark"


def _shaped(job: dict[str, Any]) -> st.SearchStrategy[bytes]:
    """``job`` whose payload's free-form body is a random value, or an object
    naming a key twice (spliced in as written: no encoder writes one)."""

    def around(value: bytes) -> bytes:
        payload = {"url": "https://example.com/", "body": _MARK}
        return _render({**job, "payload": payload}).replace(_render(_MARK), value)

    return st.one_of(
        VALUES.map(_render).map(around), st.builds(_key_twice, OBJECTS, VALUES).map(around)
    )


SHAPED = {"/api/jobs": _shaped(_HTTP_JOB), "/api/recurring-jobs": _shaped(_RECURRING)}


def _writes(openapi: dict[str, Any]) -> list[tuple[str, str]]:
    """Every (METHOD, path) that takes a body, path parameters set to 1."""
    found = []
    for template, operations in openapi["paths"].items():
        for method in operations:
            if method in WRITES:
                path = template
                for name in (p["name"] for p in operations[method].get("parameters", [])):
                    path = path.replace("{" + name + "}", "1")
                found.append((method.upper(), path))
    return sorted(found)


@pytest.fixture(scope="module")
def api(base_settings: Settings, tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    port = free_port()
    base = f"http://127.0.0.1:{port}"
    log = tmp_path_factory.mktemp("intake") / "api.log"
    with running(["api", "--port", str(port)], env_for(base_settings), log) as proc:
        wait_http(f"{base}/healthz", proc, log)
        yield base


@pytest.mark.timeout(120)
def test_random_bodies_at_every_json_intake_are_4xx(api: str) -> None:
    with httpx.Client(base_url=api, timeout=10) as http:
        routes = _writes(http.get("/openapi.json").json())
        assert len(routes) >= 15, routes  # every module's writes are there
        headers = {
            "Authorization": f"Bearer {token('admin', 1)}",
            "Content-Type": "application/json",
        }
        started = time.monotonic()

        @settings(
            max_examples=400,
            deadline=None,
            database=None,
            derandomize=True,
            suppress_health_check=list(HealthCheck),
        )
        @given(route=st.sampled_from(routes), data=st.data())
        def answered(route: tuple[str, str], data: st.DataObject) -> None:
            if time.monotonic() - started > BUDGET_S:
                return  # bounded: the examples left pass unsent
            method, path = route
            body = data.draw(st.one_of(SHAPED[path], BODIES) if path in SHAPED else BODIES)
            # A dropped connection raises here and fails the property.
            r = http.request(method, path, content=body, headers=headers)
            assert r.status_code < 500, (method, path, body[:200], r.status_code, r.text[:300])
            if not body:
                return  # no body at all: the route's own answer
            try:
                read_json(body)
            except JsonRefused as refused:
                assert r.status_code == 422, (method, path, body[:200], r.text[:300])
                twice = isinstance(refused, DuplicateKey)
                code = "duplicate_key" if twice else "validation_error"
                assert r.json()["code"] == code, (method, path, body[:200], r.text[:300])

        answered()
