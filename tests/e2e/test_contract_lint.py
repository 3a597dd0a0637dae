"""The OpenAPI contract passes both linters a client team is likely to run on
it: Redocly's recommended rules (redocly.yaml says which two it turns off, and
why) and Spectral's `spectral:oas` ruleset (.spectral.yaml), with no error and
no warning. They run on the document the code builds, the one /openapi.json
serves (tests/integration/test_openapi_contract.py: docs/openapi.json is it).

The linters are Node programs that scripts/install.sh installs, pinned, into
CONTRACT_LINTERS_DIR (default ~/.cache/reservo/contract-linters) when npm
is present; without them this test skips, saying so. It needs no network."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest

from reservo.app import openapi_document, openapi_text

REPO = Path(__file__).resolve().parents[2]
LINTERS = Path(
    os.environ.get("CONTRACT_LINTERS_DIR")
    or Path.home() / ".cache" / "reservo" / "contract-linters"
)
# Neither linter may reach the network from the suite: no usage telemetry, no update check.
QUIET = {"REDOCLY_TELEMETRY": "off", "REDOCLY_SUPPRESS_UPDATE_NOTICE": "true", "DO_NOT_TRACK": "1"}


def _linter(name: str) -> Path:
    binary = LINTERS / "node_modules" / ".bin" / name
    if shutil.which("node") is None:
        pytest.skip("SKIPPED LOUDLY: node/npm missing, the contract's linters cannot run")
    if not binary.exists():
        pytest.skip(
            f"SKIPPED LOUDLY: {binary} missing: scripts/install.sh installs the contract's "
            "linters when npm is present (CONTRACT_LINTERS_DIR names another directory)"
        )
    return binary


@pytest.fixture(scope="module")
def document(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("contract") / "openapi.json"
    path.write_text(openapi_text(openapi_document()), encoding="utf-8")
    return path


def _run(*args: str | Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [str(a) for a in args],
        capture_output=True,
        text=True,
        timeout=240,
        cwd=REPO,
        env={**os.environ, **QUIET},
        check=False,
    )


def test_redocly_recommended_finds_nothing(document: Path) -> None:
    redocly = _linter("redocly")
    done = _run(redocly, "lint", "--config", REPO / "redocly.yaml", "--format=json", document)
    report: dict[str, Any] = json.loads(done.stdout)
    problems = [
        f"{p['severity']} {p['ruleId']}: {p['message']} at {p['location'][0]['pointer']}"
        for p in report["problems"]
    ]
    assert report["totals"] == {"errors": 0, "warnings": 0, "ignored": 0}, "\n".join(problems)
    assert done.returncode == 0, done.stderr


def test_spectral_oas_finds_nothing(document: Path) -> None:
    spectral = _linter("spectral")
    done = _run(
        spectral, "lint", "-r", REPO / ".spectral.yaml", "-f", "json", "-F", "hint", document
    )
    # Spectral prints its "no results" line after the JSON array.
    results: list[dict[str, Any]] = json.loads(done.stdout[: done.stdout.rindex("]") + 1])
    problems = [f"{r['code']}: {r['message']} at {'.'.join(map(str, r['path']))}" for r in results]
    assert results == [], "\n".join(problems)
    assert done.returncode == 0, done.stderr
