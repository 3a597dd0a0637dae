"""A category's rate limit holds across real worker processes: two
``reservo worker --roles scheduler`` processes drain a backlog of ``http`` jobs
of a category limited to 20/s through the API, and together they start
100 +- 15 % of them in 5 s (each alone would start that many: the bucket is
shared). bench/scheduler/rate_limit.py measures 3 workers at 50/s over 30 s."""

from __future__ import annotations

import asyncio
from datetime import datetime
from pathlib import Path

from reservo.settings import Settings
from tests.helpers.auth import auth
from tests.helpers.procs import env_for, running
from tests.helpers.scheduler import HookServer, api_stack
from tests.helpers.waiting import wait_until

ADMIN = auth("admin", 1)
SERVICE = auth("service", 1)
RATE, SECONDS, JOBS = 20, 5.0, 250


async def test_two_worker_processes_share_a_categorys_rate_limit(
    base_settings: Settings, own_database: str, tmp_path: Path
) -> None:
    async with (
        HookServer() as hook,
        api_stack(base_settings, own_database, jobs_http_allow="127.0.0.1") as stack,
    ):
        ns = stack.container.settings.redis_namespace
        # The backlog waits behind a pause until both workers are up.
        r = await stack.client.post("/api/job-categories/http/pause", headers=ADMIN)
        assert r.status_code == 200, r.text
        body = {"category": "http", "payload": {"url": hook.url}}
        for _ in range(JOBS):
            assert (await stack.client.post("/api/jobs", json=body, headers=SERVICE)).is_success
        env = env_for(
            base_settings.with_(database_url=own_database, redis_namespace=ns),
            RESERVO_JOBS_HTTP_ALLOW="127.0.0.1",
            RESERVO_SCHEDULER_LOADER_PERIOD_S="0.2",
            RESERVO_SCHEDULER_EXECUTOR_IDLE_S="0.05",
        )
        args = ["worker", "--roles", "scheduler"]
        with (
            running(args, env, tmp_path / "a.log") as a,
            running(args, env, tmp_path / "b.log") as b,
        ):
            s = stack.container.scheduler

            async def both_up() -> bool:
                workers = {w.decode() for w in await s.redis.smembers(s.keys.workers)}
                return all(any(f"-{p.pid}-" in w for w in workers) for p in (a, b))

            await wait_until(both_up, 60, step_s=0.2)
            r = await stack.client.put(
                "/api/job-categories/http/rate-limit", json={"perSecond": RATE}, headers=ADMIN
            )
            assert r.status_code == 200, r.text
            r = await stack.client.post("/api/job-categories/http/resume", headers=ADMIN)
            assert r.status_code == 200, r.text
            await asyncio.sleep(SECONDS + 2.5)  # the refresh (<= 1 s) and the window
        rows = await stack.db.fetch(
            """SELECT e.started_at, e.worker FROM job_execution e
                 JOIN scheduled_job j ON j.id = e.job_id WHERE j.category = 'http'
                ORDER BY e.started_at"""
        )
    assert len(rows) < JOBS, "the backlog must outlast the measure"
    first: datetime = rows[0]["started_at"]
    within = [r for r in rows if (r["started_at"] - first).total_seconds() < SECONDS]
    expected = RATE * SECONDS
    assert 0.85 * expected <= len(within) <= 1.15 * expected, len(within)
    pids = {p for p in (a.pid, b.pid) if any(f"-{p}-" in r["worker"] for r in within)}
    assert pids == {a.pid, b.pid}, "both processes ran jobs"
