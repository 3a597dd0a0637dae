"""One bad row never stops the scheduler. Rows written before the run_at rule
(the database's CHECK is dropped here to write them, as an older version could)
are parked by whichever loop meets them - loader, executor, reaper - and every
other job still runs; GET /api/jobs/{jobId} reads the parked row again."""

from __future__ import annotations

import asyncio
import re
from collections.abc import AsyncIterator
from datetime import UTC, datetime, timedelta
from typing import Any

import asyncpg
import httpx
import pytest

from reservo.core.db.migrate import migrate
from reservo.scheduler.workers import run
from reservo.settings import Settings
from tests.helpers.auth import auth
from tests.helpers.scheduler import Recorder, Stack, api_stack, category
from tests.helpers.waiting import wait_until

SERVICE = auth("service", 1)
# Year 1 decodes in Python but breaks the rule; year 1 at +05:00 is year 0 in
# UTC, which asyncpg cannot decode at all (the row that stalled the loader).
BEYOND_RULE = "0001-01-01T00:00:00Z"
UNDECODABLE = "0001-01-01T00:00:00+05:00"


@pytest.fixture
async def s(own_database: str, base_settings: Settings) -> AsyncIterator[Stack]:
    async with api_stack(base_settings, own_database) as stack:
        # What an older version could write: the rule did not exist yet.
        await stack.db.execute("ALTER TABLE scheduled_job DROP CONSTRAINT ck_job_run_at_range")
        yield stack


async def _legacy_row(db: asyncpg.Connection, cat: str, run_at: str, **cols: Any) -> int:
    """A job row as an older version wrote it (run_at given as text)."""
    values: dict[str, Any] = {"status": "SCHEDULED", "pushed": False, **cols}
    names = ", ".join(values)
    params = ", ".join(f"${i + 3}" for i in range(len(values)))
    return int(
        await db.fetchval(
            f"INSERT INTO scheduled_job (category, urgency, run_at, payload, max_attempts, "
            f"created_at, {names}) VALUES ($1, 5, $2::text::timestamptz, '{{}}', 3, now(), "
            f"{params}) RETURNING id",
            cat,
            run_at,
            *values.values(),
        )
    )


async def _poisoned(client: httpx.AsyncClient, loop: str) -> float:
    text = (await client.get("/metrics")).text
    m = re.search(rf'^reservo_poison_rows_total{{loop="{re.escape(loop)}"}} (\S+)$', text, re.M)
    return float(m.group(1)) if m else 0.0


async def _job(client: httpx.AsyncClient, job_id: int) -> dict[str, Any]:
    r = await client.get(f"/api/jobs/{job_id}", headers=SERVICE)
    assert r.status_code == 200, r.text
    body: dict[str, Any] = r.json()
    return body


async def _assert_parked(s: Stack, job_id: int, loop: str) -> None:
    job = await _job(s.client, job_id)
    assert job["status"] == "DEAD", job
    assert f"parked by the {loop}" in job["lastError"], job
    run_at = datetime.fromisoformat(job["runAt"])
    assert datetime(2000, 1, 1, tzinfo=UTC) <= run_at < datetime(2100, 1, 1, tzinfo=UTC)


async def test_loader_parks_rows_it_cannot_load_and_loads_every_other_job(s: Stack) -> None:
    sched = s.container.scheduler
    cat, rec = category(), Recorder()
    sched.register(cat, rec)
    # First in the loader's run_at order, before every good job.
    beyond = await _legacy_row(s.db, cat, BEYOND_RULE)
    broken = await _legacy_row(s.db, cat, UNDECODABLE)
    before = await _poisoned(s.client, "scheduler.loader")
    now = datetime.now(UTC)
    # Rows only: the loader alone hands these to Redis.
    await sched.enqueue_bulk(
        cat, [now + timedelta(milliseconds=300 + 30 * i) for i in range(20)], [{}] * 20, [5] * 20
    )
    # Due later than the window (2 s): loaded only by a later loader pass.
    r = await s.client.post(
        "/api/jobs", json={"category": cat, "delayMs": 3500, "payload": {}}, headers=SERVICE
    )
    assert r.status_code == 201, r.text
    later = int(r.json()["jobId"])
    stop = asyncio.Event()
    workers = asyncio.create_task(run(sched, stop))
    try:

        async def all_done() -> bool:
            n = await s.db.fetchval(
                "SELECT count(*) FROM scheduled_job WHERE category = $1 AND status = 'DONE'", cat
            )
            return int(n) == 21

        await wait_until(all_done, 30, step_s=0.1)
        assert not workers.done(), "the scheduler's loops stopped"
    finally:
        stop.set()
        await asyncio.wait_for(workers, 30)
    assert (await _job(s.client, later))["status"] == "DONE"
    assert rec.calls[later] == 1
    assert len(rec.calls) == 21 and max(rec.calls.values()) == 1
    assert rec.calls[beyond] == 0 and rec.calls[broken] == 0
    for bad in (beyond, broken):
        await _assert_parked(s, bad, "scheduler.loader")
    assert "0001-01-01" in (await _job(s.client, beyond))["lastError"]
    assert await _poisoned(s.client, "scheduler.loader") == before + 2


async def test_executor_and_reaper_park_what_they_cannot_handle_and_run_the_rest(
    s: Stack,
) -> None:
    sched = s.container.scheduler
    # No loader here: these rows are already in Redis (pushed by an older
    # version) or RUNNING under a worker that died, so the executor and the
    # reaper meet them first.
    sched.config = sched.config.model_copy(update={"loaders": 0})
    cat, rec = category(), Recorder()
    sched.register(cat, rec)
    beyond = await _legacy_row(s.db, cat, BEYOND_RULE, status="QUEUED", pushed=True)
    broken = await _legacy_row(s.db, cat, UNDECODABLE, status="QUEUED", pushed=True)
    stale = "now() - interval '1 minute'"
    lost_good, lost_broken = [
        await _legacy_row(
            s.db, cat, when, status="RUNNING", pushed=True, attempts=1, worker="ghost"
        )
        for when in (datetime.now(UTC).isoformat(), UNDECODABLE)
    ]
    await s.db.execute(
        f"UPDATE scheduled_job SET heartbeat_at = {stale}, started_at = {stale} "
        "WHERE id = ANY($1::bigint[])",
        [lost_good, lost_broken],
    )
    due = int(datetime.now(UTC).timestamp() * 1000)
    await sched.dispatcher.load((i, cat, 5, due) for i in (beyond, broken))
    good = [await sched.enqueue(cat, {"n": i}) for i in range(10)]  # pushed at once
    before = {
        loop: await _poisoned(s.client, loop) for loop in ("scheduler.executor", "scheduler.reaper")
    }
    stop = asyncio.Event()
    workers = asyncio.create_task(run(sched, stop))
    try:

        async def settled() -> bool:
            rows = await s.db.fetch("SELECT id, status FROM scheduled_job WHERE category = $1", cat)
            return all(r["status"] in ("DONE", "DEAD") for r in rows)

        await wait_until(settled, 30, step_s=0.1)
        assert not workers.done(), "the scheduler's loops stopped"
    finally:
        stop.set()
        await asyncio.wait_for(workers, 30)
    for job in [*(g.id for g in good), lost_good]:
        assert (await _job(s.client, job))["status"] == "DONE"
        assert rec.calls[job] == 1
    for bad in (beyond, broken):
        assert rec.calls[bad] == 0
        await _assert_parked(s, bad, "scheduler.executor")
    assert rec.calls[lost_broken] == 0
    await _assert_parked(s, lost_broken, "scheduler.reaper")
    assert await _poisoned(s.client, "scheduler.executor") == before["scheduler.executor"] + 2
    assert await _poisoned(s.client, "scheduler.reaper") == before["scheduler.reaper"] + 1


async def test_run_at_rule_is_a_database_constraint(s: Stack, own_database: str) -> None:
    # Migration 0010 on legacy rows: pending ones parked, settled ones clamped,
    # then the constraint holds for every row and every new write.
    cat = category()
    pending = await _legacy_row(s.db, cat, BEYOND_RULE)
    broken = await _legacy_row(s.db, cat, UNDECODABLE, status="FAILED")
    settled = await _legacy_row(s.db, cat, "9999-01-01T00:00:00Z", status="DONE")
    good = await _legacy_row(s.db, cat, "2030-01-01T00:00:00Z")
    await s.db.execute("DELETE FROM schema_migrations WHERE version = 10")
    await migrate(own_database)
    for job_id in (pending, broken):
        job = await _job(s.client, job_id)
        assert job["status"] == "DEAD" and "parked by migration 0010" in job["lastError"]
    job = await _job(s.client, settled)
    assert job["status"] == "DONE" and "clamped" in job["lastError"]
    assert datetime.fromisoformat(job["runAt"]) < datetime(2100, 1, 1, tzinfo=UTC)
    job = await _job(s.client, good)
    assert job["status"] == "SCHEDULED" and job["lastError"] is None
    for when in (BEYOND_RULE, "2100-01-01T00:00:00Z"):
        with pytest.raises(asyncpg.CheckViolationError) as err:
            await _legacy_row(s.db, cat, when)
        assert err.value.constraint_name == "ck_job_run_at_range"
