"""The event contract document: served at /asyncapi.json, made from what the
modules declare, and equal to the checked-in copy (docs/asyncapi.json), so a
change to an event shows up as a diff a reviewer reads."""

from __future__ import annotations

import difflib
from pathlib import Path

import httpx
import orjson
import pytest

from reservo.bootstrap import Container, declared_asyncapi
from reservo.core.kernel.contract import NAME_STYLE, STREAM_STYLE, TYPE_PREFIX

CHECKED_IN = Path(__file__).resolve().parents[2] / "docs" / "asyncapi.json"
REGENERATE = "reservo asyncapi --out docs/asyncapi.json"


def test_the_checked_in_copy_is_the_generated_document() -> None:
    generated, checked_in = declared_asyncapi(), CHECKED_IN.read_text()
    diff = "".join(
        difflib.unified_diff(
            checked_in.splitlines(keepends=True),
            generated.splitlines(keepends=True),
            "docs/asyncapi.json (checked in)",
            "generated from the modules",
        )
    )
    assert not diff, f"the event contract changed; run `{REGENERATE}` and commit:\n{diff}"


async def test_the_service_serves_the_document(
    client: httpx.AsyncClient, container: Container
) -> None:
    r = await client.get("/asyncapi.json")
    assert r.status_code == 200 and r.headers["content-type"] == "application/json"
    assert r.json() == orjson.loads(CHECKED_IN.read_text())
    doc = r.json()
    assert doc["asyncapi"].startswith("3.")
    # Every declared event: one message, on its aggregate's channel, one style.
    specs = container.events.specs()
    messages = doc["components"]["messages"]
    assert sorted(m["name"] for m in messages.values()) == sorted(s.name for s in specs)
    for spec in specs:
        assert NAME_STYLE.match(spec.name) and STREAM_STYLE.match(spec.stream), spec.name
        assert spec.type == TYPE_PREFIX + spec.name
    addresses = {c["address"] for c in doc["channels"].values()}
    assert addresses == {s.stream for s in specs}


def test_every_example_is_valid_against_its_schema() -> None:
    jsonschema = pytest.importorskip("jsonschema", reason="dev extra: jsonschema")
    doc = orjson.loads(declared_asyncapi())
    for message in doc["components"]["messages"].values():
        jsonschema.Draft202012Validator.check_schema(message["payload"])
        for example in message["examples"]:
            jsonschema.validate(example["payload"], message["payload"])
