"""The scheduler on a Redis Cluster whose master dies mid-run: three masters and
three replicas of the test's own; while thousands of due jobs flow, the master
holding the scheduler's registry and several (category, urgency) queues is
SIGKILLed, its replica takes over after the cluster's node timeout, and the
scheduler goes on: its roles fail and retry meanwhile (logged), and afterwards
PostgreSQL says every job ran exactly once."""

from __future__ import annotations

import asyncio
import time
import uuid
from datetime import UTC, datetime, timedelta
from pathlib import Path

import asyncpg
from redis.crc import key_slot
from structlog.testing import capture_logs

from reservo.scheduler.domain import Keys
from tests.helpers.scheduler import Recorder, category, done_log_duplicates, make, running, statuses
from tests.helpers.waiting import wait_until
from tests.redis_cluster import LocalCluster, Node

N = 3000
SPREAD_S = 6.0  # the jobs fall due over this long, from just after the start
NODE_TIMEOUT_MS = 2000


def _categories(victim: Node, keys: Keys, n: int, on_victim: int) -> list[str]:
    """``n`` categories of this test, at least ``on_victim`` of whose queues (at
    urgency 0 or 1) live on the master that will be killed."""

    def served(cat: str, urgency: int) -> bool:
        slot = key_slot(keys.queue(cat, urgency).encode())
        return any(a <= slot <= b for a, b in victim.slots)

    while True:
        cats = [category() for _ in range(n)]
        if sum(served(c, u) for c in cats for u in (0, 1)) >= on_victim:
            return cats


async def test_a_master_killed_mid_run_loses_no_job_and_runs_none_twice(
    database_url: str, db: asyncpg.Connection, tmp_path: Path
) -> None:
    with LocalCluster(tmp_path / "cluster", node_timeout_ms=NODE_TIMEOUT_MS) as cluster:
        ns = f"failover-{uuid.uuid4().hex[:8]}"
        # What a lost write costs is a late job, until the next full resync.
        s = make(database_url, cluster.target, ns, loader_period_s=0.1, resync_period_s=2.0)
        victim = cluster.master_of(s.keys.registry)
        cats = _categories(victim, s.keys, 6, on_victim=3)
        rec = Recorder()
        for c in cats:
            s.register(c, rec)
        try:
            base = datetime.now(UTC) + timedelta(milliseconds=300)
            per = N // len(cats)
            for c in cats:
                run_ats = [base + timedelta(seconds=SPREAD_S * i / per) for i in range(per)]
                await s.enqueue_bulk(
                    c, run_ats, [{} for _ in range(per)], [i % 2 for i in range(per)]
                )
            with capture_logs() as logs:
                async with running(s):
                    await asyncio.sleep(1.5)  # mid-run: some done, some queued, some future
                    before = sum([(await statuses(db, c))["DONE"] for c in cats])
                    assert 0 < before < N
                    cluster.kill(victim.port)
                    t0 = time.monotonic()
                    await asyncio.to_thread(cluster.wait_failover, victim.port, 30)
                    failover_s = time.monotonic() - t0
                    assert cluster.master_of(s.keys.registry).port != victim.port

                    async def all_done() -> bool:
                        done = [(await statuses(db, c))["DONE"] for c in cats]
                        return sum(done) == N

                    await wait_until(all_done, 60, step_s=0.2)
                    finished_s = time.monotonic() - t0
                    await asyncio.sleep(0.5)  # nothing runs a second time afterwards
            assert len(rec.calls) == N
            assert max(rec.calls.values()) == 1
            for c in cats:
                assert await done_log_duplicates(db, c) == 0
            retried = [e for e in logs if e["event"] == "scheduler_error"]
            assert retried, "the outage should show as retried scheduler errors"
            print(
                f"\nfailover: master {victim.port} killed with {N - before} of {N} jobs left; "
                f"replica promoted after {failover_s:.1f} s; all done {finished_s:.1f} s "
                f"after the kill; {len(retried)} scheduler errors retried "
                f"({sorted({e['role'] for e in retried})})"
            )
        finally:
            await s.close()
