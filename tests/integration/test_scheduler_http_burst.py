"""A burst of ``http`` jobs due together to one destination that answers
quickly (issue 39): the jobs beyond the destination's share of calls in flight
wait their turn, none is put back for a second.

Before, each job beyond the share was put back (due again a second later),
where it met the same share again: 2,000 jobs due over 8 s to one listener
fired up to 6 s late (bench/scheduler/http_burst.py)."""

from __future__ import annotations

import asyncio
from datetime import UTC, datetime, timedelta

from reservo.scheduler import Scheduler
from reservo.scheduler.workers import run
from reservo.settings import Settings
from tests.helpers.auth import auth
from tests.helpers.scheduler import HookServer, api_stack
from tests.helpers.waiting import wait_until

SERVICE = auth("service", 1)
# Over the destination's share (RESERVO_SCHEDULER_HTTP_PER_DESTINATION) six times.
SHARE, JOBS = 16, 100


async def test_a_burst_to_one_quick_destination_waits_its_turn_and_is_not_put_back(
    own_database: str, base_settings: Settings
) -> None:
    async with (
        HookServer() as hook,
        api_stack(
            base_settings,
            own_database,
            jobs_http_allow="127.0.0.1",
            scheduler_http_per_destination=SHARE,
        ) as stack,
    ):
        run_at = (datetime.now(UTC) + timedelta(seconds=4)).isoformat()
        ids = []
        for i in range(JOBS):
            job = {"category": "http", "runAt": run_at, "payload": {"url": f"{hook.url}/{i}"}}
            r = await stack.client.post("/api/jobs", json=job, headers=SERVICE)
            assert r.status_code == 201, r.text
            ids.append(int(r.json()["jobId"]))
        due = datetime.fromisoformat(run_at)
        scheduler = stack.container.scheduler
        assert isinstance(scheduler, Scheduler)
        stop = asyncio.Event()
        workers = asyncio.create_task(run(scheduler, stop))
        try:
            await wait_until(lambda: _all_called(hook, JOBS), 30)
        finally:
            stop.set()
            await asyncio.wait_for(workers, 30)
        rows = await stack.db.fetch(
            "SELECT id, run_at FROM scheduled_job WHERE id = ANY($1::bigint[])", ids
        )
    keys = [request["idempotency-key"] for request in hook.requests]
    assert sorted(keys) == sorted(str(job_id) for job_id in ids)  # each called once
    # None put back: a job put back is due again BUSY_DELAY_S (1 s) later.
    assert {row["run_at"] for row in rows} == {due}, sorted({row["run_at"] for row in rows})
    # None early. (How late the last one is depends on the machine: each turn
    # of the share is a call to the listener, 0.2 s and more on a loaded one.)
    lateness = sorted((at - due).total_seconds() for at in hook.arrived)
    assert lateness[0] >= 0, lateness[:5]


async def _all_called(hook: HookServer, n: int) -> bool:
    return len(hook.requests) >= n
