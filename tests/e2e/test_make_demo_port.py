"""`make demo` on a chosen port: PORT= or RESERVO_HTTP_PORT (the README's curls
follow PORT through BASE; tests/acceptance/test_readme.py runs them so)."""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


def _demo_command(*args: str, **env: str) -> str:
    make = shutil.which("make")
    if make is None:
        pytest.skip("make is not installed")
    clean = {k: v for k, v in os.environ.items() if k not in ("PORT", "RESERVO_HTTP_PORT")}
    # -n: the commands, not run; VENV: one that exists, so nothing is installed.
    done = subprocess.run(
        [make, "-n", "-C", str(ROOT), "demo", "VENV=/nonexistent-venv", *args],
        env={**clean, **env},
        capture_output=True,
        text=True,
        timeout=30,
        check=True,
    )
    return next(line for line in done.stdout.splitlines() if "reservo up" in line)


@pytest.mark.parametrize(
    ("args", "env"),
    [
        (("PORT=9123",), {}),
        ((), {"PORT": "9123"}),
        ((), {"RESERVO_HTTP_PORT": "9123"}),
        (("RESERVO_HTTP_PORT=9123",), {}),
    ],
    ids=["make-PORT", "env-PORT", "env-RESERVO_HTTP_PORT", "make-RESERVO_HTTP_PORT"],
)
def test_make_demo_takes_the_port(args: tuple[str, ...], env: dict[str, str]) -> None:
    assert _demo_command(*args, **env).split()[-3:] == ["--demo", "--port", "9123"]


def test_make_demo_without_a_port_leaves_the_default() -> None:
    assert _demo_command().split()[-2:] == ["up", "--demo"]
