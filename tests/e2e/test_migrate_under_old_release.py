"""Migrations are a release step taken while the previous release still serves
(docs/DEPLOY.md, "Releases"): the previous release's own code, taken from git,
serves a mixed write load through HTTP (and its relay delivers the events) on a
database at its own schema; this release's migrations are applied meanwhile; the
old code answers every request, before and after, without one 5xx or error."""

from __future__ import annotations

import asyncio
import io
import os
import shutil
import subprocess
import sys
import tarfile
import time
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import asyncpg
import httpx
import pytest

from reservo.core.db.migrate import available, migrate
from tests.helpers.auth import JWT_SECRET, PAY_SECRET, RESULTS_SECRET
from tests.helpers.databases import DatabaseAt
from tests.helpers.procs import free_port, wait_http
from tests.helpers.traffic import Traffic, run_for

ROOT = Path(__file__).resolve().parents[2]
# The last commit of the third release (0.3.0, CHANGELOG.md, bench/releases.toml):
# the code that still runs while this release's migrations are applied. Move it
# forward at each release.
PREVIOUS_RELEASE = "53e1db8"
LOOPS = 4


def _git(*args: str) -> subprocess.CompletedProcess[bytes]:
    return subprocess.run(
        ["git", "-C", str(ROOT), *args], capture_output=True, timeout=60, check=False
    )


@pytest.fixture
def old_src(tmp_path: Path) -> Path:
    """The previous release's ``src`` (git archive), or a loud skip without history."""
    commit = f"{PREVIOUS_RELEASE}^{{commit}}"
    if shutil.which("git") is None or _git("cat-file", "-e", commit).returncode:
        pytest.skip(
            f"SKIPPED LOUDLY: commit {PREVIOUS_RELEASE} (release 0.3.0) is not in this "
            "checkout (no git, or a shallow clone): fetch the history to run this test"
        )
    archive = _git("archive", "--format=tar", PREVIOUS_RELEASE, "src")
    assert archive.returncode == 0, archive.stderr.decode()
    with tarfile.open(fileobj=io.BytesIO(archive.stdout)) as tar:
        tar.extractall(tmp_path / "old", filter="data")
    return tmp_path / "old" / "src"


@pytest.fixture
async def empty_database(database_at: DatabaseAt) -> str:
    """A database with no schema: the old release migrates it to its own."""
    return await database_at(0)


def old_env(src: Path, database_url: str, redis_url: str, port: int) -> dict[str, str]:
    """The previous release's environment: its package first on the path."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("RESERVO_")}
    env.update(
        PYTHONPATH=str(src),  # the old package wins over the installed one
        RESERVO_DATABASE_URL=database_url,
        RESERVO_REDIS_URL=redis_url,
        RESERVO_REDIS_NAMESPACE=f"old-{uuid.uuid4().hex[:8]}",
        # The old release had default secrets; set them anyway, as a deployment does.
        RESERVO_JWT_SECRET=JWT_SECRET,
        RESERVO_PAYMENTS_WEBHOOK_SECRET=PAY_SECRET,
        RESERVO_RESULTS_WEBHOOK_SECRET=RESULTS_SECRET,
        RESERVO_RENTALS_PAYMENT_GATEWAY="sandbox",
        RESERVO_HTTP_PORT=str(port),
        RESERVO_OUTBOX_POLL_INTERVAL_S="0.05",
        RESERVO_LOG_LEVEL="WARNING",
        RESERVO_LOG_JSON="true",
    )
    return env


def old_reservo(env: dict[str, str], *args: str) -> str:
    done = subprocess.run(
        [sys.executable, "-m", "reservo.cli", *args],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    return done.stdout + done.stderr


@contextmanager
def old_process(env: dict[str, str], log: Path, *args: str) -> Iterator[subprocess.Popen[bytes]]:
    with log.open("wb") as out:
        proc = subprocess.Popen(
            [sys.executable, "-m", "reservo.cli", *args], env=env, stdout=out, stderr=out
        )
        try:
            yield proc
        finally:
            proc.terminate()
            try:
                proc.wait(15)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()


async def outbox_drained(database_url: str, timeout_s: float = 20) -> int:
    """PENDING outbox rows left once they are all gone or ``timeout_s`` passed."""
    conn = await asyncpg.connect(database_url)
    try:
        for _ in range(int(timeout_s / 0.2)):
            left = int(await conn.fetchval("SELECT count(*) FROM outbox WHERE status = 'PENDING'"))
            if not left:
                break
            await asyncio.sleep(0.2)
        return left
    finally:
        await conn.close()


def errors_in(log: Path) -> list[str]:
    return [
        line
        for line in log.read_text(errors="replace").splitlines()
        if '"level": "error"' in line or '"level": "critical"' in line or "Traceback" in line
    ]


@pytest.fixture
def old_release(old_src: Path, empty_database: str, services: tuple[str, str]) -> dict[str, str]:
    """The previous release's environment, its schema migrated by its own code."""
    env = old_env(old_src, empty_database, services[1], free_port())
    found = subprocess.run(
        [sys.executable, "-c", "import reservo; print(reservo.__file__)"],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    ).stdout.strip()
    assert found.startswith(str(old_src)), f"the old release did not run: {found}"
    old_reservo(env, "db", "migrate")
    return env


async def test_the_previous_release_serves_while_this_releases_migrations_apply(
    old_release: dict[str, str], old_src: Path, empty_database: str, tmp_path: Path
) -> None:
    env, port = old_release, old_release["RESERVO_HTTP_PORT"]
    old_versions = {int(p.name[:4]) for p in (old_src / "reservo" / "migrations").glob("*.sql")}
    new = [m.version for m in available() if m.version not in old_versions]
    assert new, f"no migration since {PREVIOUS_RELEASE}: move PREVIOUS_RELEASE to the last release"

    api_log, worker_log = tmp_path / "old-api.log", tmp_path / "old-worker.log"
    with (
        old_process(env, api_log, "api", "--port", port) as api,
        old_process(env, worker_log, "worker", "--roles", "relay,maintenance") as worker,
    ):
        base = f"http://127.0.0.1:{port}"
        wait_http(f"{base}/readyz", api, api_log)
        async with httpx.AsyncClient(base_url=base, timeout=30) as client:
            traffic = await Traffic.setup(client)
            stop = asyncio.Event()
            load = run_for(traffic, LOOPS, stop)
            await asyncio.sleep(1.0)
            migrating = time.monotonic()
            applied = await migrate(empty_database)
            migrated = time.monotonic()
            await asyncio.sleep(2.0)  # the old code on the new schema
            stop.set()
            await load
        assert [m.version for m in applied] == new
        # The previous release's promise for columns added to tables it reads with
        # `*` (docs/DEPLOY.md): the first such statement on a pooled connection
        # fails, answered 503 `unavailable` (Retry-After), never a 500 or a dropped
        # connection; its retries succeed (every kind succeeds after the migration,
        # below).
        broken = [
            a
            for a in traffic.failures()
            if a.status != 503 or '"code":"unavailable"' not in a.detail
        ]
        assert broken == [], broken[:5]
        assert all(a.at >= migrating for a in traffic.failures()), traffic.failures()[:5]
        unexpected = [a for a in traffic.unexpected() if a not in traffic.failures()]
        assert unexpected == [], unexpected[:5]
        for kind in ("booking", "transfer", "hold", "job"):
            assert traffic.succeeded(kind) > 0, kind
            assert traffic.succeeded(kind, after=migrated) > 0, f"no {kind} after the migration"
        assert any(a.at >= migrating for a in traffic.answers)
        # The old relay delivers every event written before and after, on the new schema.
        assert await outbox_drained(empty_database) == 0
        assert api.poll() is None and worker.poll() is None
    assert errors_in(api_log) == [], api_log.read_text()[-3000:]
    assert errors_in(worker_log) == [], worker_log.read_text()[-3000:]
