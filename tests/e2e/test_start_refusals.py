"""A database that stops a command is one line on stderr naming
RESERVO_DATABASE_URL and what to fix, exit 2, no traceback, no password:
unreachable (for `db migrate` and `up`, which cannot work without it),
refusing the credentials, missing, refusing a migration, or (for `api` and
`worker`) lacking a migration of this release. A database merely away does not
stop `api` and `worker`: they start, say so, and wait for it (requests answer
503 meanwhile), as they do when Redis or Kafka is away."""

from __future__ import annotations

import os
import subprocess
import uuid
from pathlib import Path
from urllib.parse import urlsplit

import asyncpg
import httpx
import pytest

from reservo.core.db.migrate import available
from tests.helpers.auth import JWT_SECRET, PAY_SECRET, RESULTS_SECRET
from tests.helpers.databases import DatabaseAt, url_of
from tests.helpers.procs import BIN, free_port, running, wait_http

SECRETS = {
    "RESERVO_JWT_SECRET": JWT_SECRET,
    "RESERVO_PAYMENTS_WEBHOOK_SECRET": PAY_SECRET,
    "RESERVO_RESULTS_WEBHOOK_SECRET": RESULTS_SECRET,
}
COMMANDS = {
    "db migrate": ["db", "migrate"],
    "up": ["up", "--port", "1"],
    "api": ["api", "--port", "1"],
    "worker": ["worker", "--roles", "relay"],
}
UNREACHABLE = "postgresql://postgres:hunter2-never-shown@127.0.0.1:1/x"


def _env(database_url: str, redis_url: str, tmp: Path) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("RESERVO_")}
    return {
        **env,
        **SECRETS,
        "RESERVO_DATABASE_URL": database_url,
        "RESERVO_REDIS_URL": redis_url,
        "RESERVO_REDIS_NAMESPACE": f"refusals-{uuid.uuid4().hex[:8]}",
        "RESERVO_DATA_DIR": str(tmp),
    }


def _assert_refused(command: str, env: dict[str, str], *fragments: str) -> None:
    done = subprocess.run(
        [str(BIN), *COMMANDS[command]], env=env, capture_output=True, timeout=90, check=False
    )
    out, err = done.stdout.decode(), done.stderr.decode()
    lines = [line for line in err.splitlines() if line.strip()]
    assert done.returncode == 2, (command, done.returncode, out, err)
    assert len(lines) == 1, (command, err)
    assert out.strip() == "", (command, out)
    assert lines[0].startswith("reservo: RESERVO_DATABASE_URL"), (command, err)
    for fragment in fragments:
        assert fragment in lines[0], (command, fragment, err)
    assert "Traceback" not in err and "uncaught_exception" not in err
    assert "hunter2" not in err


@pytest.mark.parametrize("command", ["db migrate", "up"])
def test_an_unreachable_database_stops_migrate_and_up_in_one_line(
    command: str, services: tuple[str, str], tmp_path: Path
) -> None:
    env = _env(UNREACHABLE, services[1], tmp_path)
    _assert_refused(command, env, "127.0.0.1:1/x", "PostgreSQL is unreachable")
    assert not (tmp_path / "postgres").exists()  # `up` started no embedded server instead


@pytest.mark.parametrize("command", sorted(COMMANDS))
def test_credentials_refused_or_a_missing_database_stop_every_command_in_one_line(
    command: str, services: tuple[str, str], tmp_path: Path
) -> None:
    admin = services[0]
    at = urlsplit(admin)
    host = f"{at.hostname}:{at.port or 5432}"
    nobody = f"nobody_{uuid.uuid4().hex[:8]}"
    env = _env(f"postgresql://{nobody}:hunter2@{host}/postgres", services[1], tmp_path)
    _assert_refused(command, env, "refused the credentials", nobody)

    missing = f"reservo_missing_{uuid.uuid4().hex[:8]}"
    env = _env(url_of(admin, missing), services[1], tmp_path)
    _assert_refused(command, env, f'database "{missing}" does not exist')


@pytest.mark.parametrize("command", ["api", "worker"])
async def test_a_migration_not_applied_stops_api_and_worker_in_one_line(
    command: str, services: tuple[str, str], database_at: DatabaseAt, tmp_path: Path
) -> None:
    last = available()[-1]
    behind = await database_at(available()[-2].version)
    env = _env(behind, services[1], tmp_path)
    _assert_refused(
        command, env, "1 migration(s)", f"{last.version:04d}_{last.name}", "reservo db migrate"
    )
    never = await database_at(0)
    _assert_refused(command, _env(never, services[1], tmp_path), "reservo db migrate")


async def test_a_migration_the_database_refuses_stops_migrate_in_one_line(
    services: tuple[str, str], database_at: DatabaseAt, tmp_path: Path
) -> None:
    url = await database_at(0)
    conn = await asyncpg.connect(url)
    try:  # a table of the first migration's, in another shape: the migration fails
        await conn.execute("CREATE TABLE idempotency_key (x int)")
    finally:
        await conn.close()
    first = available()[0]
    _assert_refused(
        "db migrate",
        _env(url, services[1], tmp_path),
        f"migration {first.version:04d}_{first.name} failed",
        'relation "idempotency_key" already exists',
    )


def test_the_api_starts_while_the_database_is_away_and_says_so(
    services: tuple[str, str], tmp_path: Path
) -> None:
    """Not a refusal: requests answer 503 until PostgreSQL is back."""
    port = free_port()
    env = {**_env(UNREACHABLE, services[1], tmp_path), "RESERVO_LOG_LEVEL": "WARNING"}
    log = tmp_path / "api.log"
    with running(["api", "--port", str(port)], env, log) as proc:
        wait_http(f"http://127.0.0.1:{port}/healthz", proc, log)
        ready = httpx.get(f"http://127.0.0.1:{port}/readyz", timeout=5)
        assert ready.status_code == 503
        assert ready.json()["checks"]["postgres"] == "down"
    text = log.read_text()
    assert "database_unreachable_at_start" in text and "RESERVO_DATABASE_URL" in text
    assert "Traceback" not in text and "hunter2" not in text
