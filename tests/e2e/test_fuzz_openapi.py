"""schemathesis 4.x against `reservo up --demo`, from the document it serves,
as an adopting team runs it: every check (the default: no 5xx, statuses,
content types, headers and bodies as documented, schema-valid data accepted and
invalid data refused, 405s and their Allow, auth not ignored, deleted things
gone), positive and negative data, every phase (examples, coverage, fuzzing,
stateful), as admin, patient and bettor, with the hostile shapes of
tests/e2e/hostile_shapes.py mixed into the bodies. Where a check cannot know
what the service rightly does (an opaque cursor, a rule across fields), it is
off for those operations only, with the reason beside it:
tests/e2e/schemathesis.toml.

Bounded: each role gets MAX_TIME_S of the tool's time budget and MAX_EXAMPLES
cases per operation and phase; the whole file takes about 4 minutes on 2 cores
(slow: not in `make test-fast`)."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from reservo.settings import Settings
from tests.helpers.auth import token
from tests.helpers.procs import env_for, free_port, running, wait_http

SCHEMATHESIS = Path(sys.executable).parent / "schemathesis"
REPO_ROOT = Path(__file__).resolve().parents[2]
CONFIG = Path(__file__).with_name("schemathesis.toml")
MAX_TIME_S, MAX_EXAMPLES = 60, 15
# Who fuzzes: the admin may do everything; a patient and a bettor reach their
# own resources and are refused (403, or 404 for a single resource: API.md's
# rule) everyone else's. Patient 100 holds a seat in the demo's full slot.
ROLES = [("admin", 1), ("patient", 100), ("bettor", 424242)]

pytestmark = [pytest.mark.slow, pytest.mark.timeout(4 * MAX_TIME_S + 120)]


def _schemathesis(base: str, role: str, sub: int) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [
            str(SCHEMATHESIS),
            "--config-file",
            str(CONFIG),
            "run",
            f"{base}/openapi.json",
            # No --checks: every check is on by default, and a check named on the
            # command line would override the operations' settings of the config.
            "--mode",
            "all",
            "--max-examples",
            str(MAX_EXAMPLES),
            "--max-time",
            str(MAX_TIME_S),
            "--seed",
            "7",
            "--workers",
            "2",
            "--no-shrink",
            "--exclude-path",
            "/metrics",
            "--warnings",
            "off",
        ],
        capture_output=True,
        text=True,
        timeout=MAX_TIME_S + 60,
        env={
            **os.environ,
            "SCHEMATHESIS_HOOKS": "tests.e2e.hostile_shapes",
            # The config's bearerAuth (tests/e2e/schemathesis.toml).
            "RESERVO_FUZZ_TOKEN": token(role, sub, ttl_s=3600),
        },
        cwd=REPO_ROOT,
        check=False,
    )


def test_fuzzing_the_demo_with_every_check_finds_nothing(
    base_settings: Settings, own_database: str, tmp_path: Path
) -> None:
    port = free_port()
    base = f"http://127.0.0.1:{port}"
    log = tmp_path / "up.log"
    # A database and a Redis namespace of its own: as an admin the fuzzer pauses
    # and rate-limits job categories and retries DEAD jobs, which must not reach
    # other tests' jobs.
    own = base_settings.with_(database_url=own_database, redis_namespace=f"fuzz-{port}")
    env = env_for(own, RESERVO_DATA_DIR=str(tmp_path))
    with running(["up", "--demo", "--port", str(port)], env, log) as proc:
        wait_http(f"{base}/readyz", proc, log, timeout_s=90)
        failed = []
        for role, sub in ROLES:
            result = _schemathesis(base, role, sub)
            selected = re.search(r"Operations:\s+(\d+) selected", result.stdout)
            tested = re.search(r"Tested:\s+(\d+)", result.stdout)
            # Every operation of the document exercised, not a run cut short.
            everything = selected and tested and selected[1] == tested[1]
            if result.returncode != 0 or not everything:
                failed.append(f"--- {role} ---\n{result.stdout[-8000:]}\n{result.stderr[-2000:]}")
    assert not failed, "\n".join(failed) + f"\n--- service log ---\n{log.read_text()[-4000:]}"
