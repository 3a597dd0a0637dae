"""Every named SQL block says what it is for in the line under its name, so a
reader of a queries.sql never has to work it out from the SQL alone."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

import reservo

NAME = re.compile(r"^-- name: (\w+)$")


ROOT = Path(reservo.__file__).parent
# The queries.sql of each of core's compartments and of every module that has one.
QUERY_FILES = sorted(ROOT.rglob("queries.sql"))


def undescribed(text: str) -> list[str]:
    """The names of the blocks whose next line is not a non-empty comment."""
    lines = text.splitlines()
    missing = []
    for i, line in enumerate(lines):
        named = NAME.match(line)
        if named is None:
            continue
        nxt = lines[i + 1] if i + 1 < len(lines) else ""
        if not nxt.startswith("-- ") or not nxt[3:].strip() or NAME.match(nxt):
            missing.append(named[1])
    return missing


def test_the_query_files_are_found() -> None:
    places = {f.parent.relative_to(ROOT).as_posix() for f in QUERY_FILES}
    assert {
        "core/db",
        "core/http",
        "core/messaging",
        "core/maintenance",
        "notifications",
        "appointments",
        "rentals",
        "wallet",
        "betting",
        "scheduler",
    } <= places
    assert "core" not in places  # each compartment holds its own queries


@pytest.mark.parametrize(
    "queries", QUERY_FILES, ids=lambda f: f.parent.relative_to(ROOT).as_posix()
)
def test_every_named_block_has_a_description_line(queries: Path) -> None:
    text = queries.read_text(encoding="utf-8")
    assert "-- name:" in text
    assert undescribed(text) == []


def test_a_block_without_a_description_is_caught() -> None:
    text = (
        "-- name: a\n-- Reads a.\nSELECT 1;\n\n-- name: b\nSELECT 2;\n-- name: c\n--\nSELECT 3;\n"
    )
    assert undescribed(text) == ["b", "c"]
