"""A schemathesis fuzz pass over the served OpenAPI schema finds no 5xx, with the
hostile shapes of tests/e2e/hostile_shapes.py mixed into the generated bodies."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from reservo.settings import Settings
from tests.helpers.auth import token
from tests.helpers.procs import env_for, free_port, running, wait_http

SCHEMATHESIS = Path(sys.executable).parent / "schemathesis"
REPO_ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.timeout(600)
def test_fuzzing_the_api_finds_no_server_error(
    base_settings: Settings, own_database: str, tmp_path: Path
) -> None:
    port = free_port()
    base = f"http://127.0.0.1:{port}"
    log = tmp_path / "api.log"
    # A database of its own: as an admin the fuzzer pauses and rate-limits job
    # categories and retries DEAD jobs, which must not reach other tests' jobs.
    own = base_settings.with_(database_url=own_database, redis_namespace=f"fuzz-{port}")
    with running(["api", "--port", str(port)], env_for(own), log) as proc:
        wait_http(f"{base}/healthz", proc, log)
        for role, sub in (("admin", 1), ("patient", 424242)):
            result = subprocess.run(
                [
                    str(SCHEMATHESIS),
                    "run",
                    f"{base}/openapi.json",
                    "--checks",
                    "not_a_server_error",
                    "--header",
                    f"Authorization: Bearer {token(role, sub)}",
                    "--max-examples",
                    "30",
                    "--seed",
                    "7",
                    "--max-time",
                    "150",
                    "--exclude-path",
                    "/metrics",
                    "--warnings",
                    "off",
                ],
                capture_output=True,
                text=True,
                timeout=240,
                env={**os.environ, "SCHEMATHESIS_HOOKS": "tests.e2e.hostile_shapes"},
                cwd=REPO_ROOT,
            )
            assert result.returncode == 0, (
                f"schemathesis ({role}) found a server error:\n{result.stdout[-6000:]}\n"
                f"{result.stderr[-2000:]}\n--- api log ---\n{log.read_text()[-4000:]}"
            )
