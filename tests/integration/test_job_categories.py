"""Third release of the Delayed jobs API, through HTTP: pausing and resuming a
category (due jobs wait, none lost, none run, none failed; on resume they run
in due order, also in a worker that has not seen the pause yet), its rate limit
(the API; the rate across worker processes is tests/e2e/test_job_rate_limit.py),
the category overview, and the bulk retry of DEAD jobs raced by two operators."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from datetime import UTC, datetime, timedelta
from typing import Any

import httpx
import pytest

from reservo.bootstrap import Container
from reservo.settings import Settings
from tests.helpers.auth import auth, new_id
from tests.helpers.scheduler import Recorder, Stack, api_stack, category, make, running, statuses
from tests.helpers.waiting import wait_until

SERVICE = auth("service", 1)
ADMIN = auth("admin", 1)


def now() -> datetime:
    return datetime.now(UTC)


async def _create(client: httpx.AsyncClient, cat: str, run_at: datetime) -> int:
    body = {"category": cat, "urgency": 5, "runAt": run_at.isoformat(), "payload": {}}
    r = await client.post("/api/jobs", json=body, headers=SERVICE)
    assert r.status_code == 201, r.text
    return int(r.json()["jobId"])


async def _overview(client: httpx.AsyncClient) -> dict[str, dict[str, Any]]:
    r = await client.get("/api/job-categories", headers=SERVICE)
    assert r.status_code == 200, r.text
    return {c["category"]: c for c in r.json()}


async def _pause(client: httpx.AsyncClient, cat: str, paused: bool = True) -> None:
    action = "pause" if paused else "resume"
    r = await client.post(f"/api/job-categories/{cat}/{action}", headers=ADMIN)
    assert r.status_code == 200, r.text
    assert r.json() == {"category": cat, "paused": paused}


@pytest.fixture
async def stack(base_settings: Settings, own_database: str) -> AsyncIterator[Stack]:
    # One executor: the order jobs start in is the order they were claimed.
    async with api_stack(
        base_settings, own_database, scheduler_window_s=300, scheduler_executors=1
    ) as s:
        yield s


# -- pause and resume ------------------------------------------------------------------


async def test_pause_and_resume_answer_and_refuse(
    client: httpx.AsyncClient, container: Container
) -> None:
    cat = category()
    container.scheduler.register(cat, Recorder())
    await _pause(client, cat)
    await _pause(client, cat)  # pausing twice is still paused
    assert (await _overview(client))[cat]["paused"] is True
    await _pause(client, cat, paused=False)
    assert (await _overview(client))[cat]["paused"] is False
    for path in (f"/api/job-categories/{cat}/pause", f"/api/job-categories/{cat}/resume"):
        assert (await client.post(path)).status_code == 401
        for role in ("service", "patient", "doctor"):
            r = await client.post(path, headers=auth(role, new_id()))
            assert (r.status_code, r.json()["code"]) == (403, "forbidden"), (path, role)
    for bad in ("BAD", "a" * 65, "-x", "x%20y"):
        r = await client.post(f"/api/job-categories/{bad}/pause", headers=ADMIN)
        assert (r.status_code, r.json()["code"]) == (422, "validation_error"), bad
        assert r.headers["content-type"].startswith("application/problem+json")
    assert (await _overview(client))[cat]["paused"] is False  # nothing changed


async def test_a_category_no_handler_serves_is_404_and_not_created(
    client: httpx.AsyncClient, container: Container
) -> None:
    """Pause, resume and rate limit act on categories a handler serves: the
    modules' own (internal ones too) or one registered in code. Any other name
    is 404 `category_not_found`, and no category is created."""
    unserved = category()
    before = await _overview(client)
    for method, action, body in (
        ("POST", "pause", None),
        ("POST", "resume", None),
        ("PUT", "rate-limit", {"perSecond": 5}),
        ("PUT", "rate-limit", {"perSecond": None}),
    ):
        r = await client.request(
            method, f"/api/job-categories/{unserved}/{action}", json=body, headers=ADMIN
        )
        assert (r.status_code, r.json()["code"]) == (404, "category_not_found"), (action, r.text)
        assert r.headers["content-type"].startswith("application/problem+json")
    assert await _overview(client) == before
    assert unserved not in before
    async with container.db.connection() as conn:
        rows = await conn.fetchval(
            "SELECT count(*) FROM job_category WHERE category = $1", unserved
        )
    assert rows == 0
    # The declared ones, internal included, are served.
    for declared in ("http", "rentals.expire-hold", "appointments.reminder"):
        r = await client.put(
            f"/api/job-categories/{declared}/rate-limit", json={"perSecond": None}, headers=ADMIN
        )
        assert r.status_code == 200, (declared, r.text)


async def test_a_paused_categorys_due_jobs_wait_and_run_in_due_order_on_resume(
    stack: Stack,
) -> None:
    cat, rec = category(), Recorder()
    s = stack.container.scheduler
    s.register(cat, rec)
    await _pause(stack.client, cat)
    # Created in an order that is not their due order; all due within a second.
    base = now()
    offsets = [0.9, 0.1, 0.5, 0.3, 0.7, 0.0, 0.8, 0.2, 0.6, 0.4] * 2
    jobs = {
        await _create(stack.client, cat, base + timedelta(seconds=o, microseconds=i)): o
        for i, o in enumerate(offsets)
    }
    async with running(s):
        await asyncio.sleep(2.5)  # every job is due, and the workers run
        assert rec.calls == {}
        # Nothing lost, nothing failed: all wait, already in Redis's due queue.
        assert await statuses(stack.db, cat) == {"QUEUED": len(jobs)}
        assert await s.redis.llen(s.keys.queue(cat, 5)) == len(jobs)
        assert (
            await stack.db.fetchval(
                "SELECT count(*) FROM job_execution WHERE job_id = ANY($1)", list(jobs)
            )
            == 0
        )
        row = (await _overview(stack.client))[cat]
        assert (row["paused"], row["due"], row["running"], row["dead"]) == (True, len(jobs), 0, 0)

        await _pause(stack.client, cat, paused=False)
        await wait_until(lambda: _all_done(stack, cat, len(jobs)), 15)
    assert all(n == 1 for n in rec.calls.values()) and set(rec.calls) == set(jobs)
    order = sorted(jobs, key=lambda j: rec.starts[j][0])
    rows = await stack.db.fetch(
        "SELECT id FROM scheduled_job WHERE id = ANY($1) ORDER BY run_at, id", list(jobs)
    )
    assert order == [r["id"] for r in rows]


async def _all_done(stack: Stack, cat: str, n: int) -> bool:
    return await statuses(stack.db, cat) == {"DONE": n}


async def test_a_worker_that_has_not_seen_the_pause_never_runs_a_job_of_it(
    stack: Stack, base_settings: Settings, own_database: str
) -> None:
    """The pause is in the claim: a worker process whose cache still says
    "running" takes the jobs from Redis, is refused by the claim, puts them back
    in due order and stops taking them; none is lost, and they run on resume."""
    cat, rec = category(), Recorder()
    ns = stack.container.settings.redis_namespace
    assert base_settings.redis_url is not None
    stale = make(own_database, base_settings.redis_url, ns, category_refresh_s=3600)
    other = stack.container.scheduler
    for each in (stale, other):
        each.register(cat, rec)
    try:
        assert cat not in (await stale.categories.current()).paused  # read before the pause
        await _pause(stack.client, cat)
        jobs = [await _create(stack.client, cat, now()) for _ in range(10)]
        async with running(stale):
            await asyncio.sleep(1.5)
        assert rec.calls == {}
        assert cat in (await stale.categories.current()).paused  # learnt from the claim
        assert await statuses(stack.db, cat) == {"QUEUED": len(jobs)}
        queued = await stale.redis.lrange(stale.keys.queue(cat, 5), 0, -1)
        assert sorted(int(i) for i in queued) == sorted(jobs)

        await _pause(stack.client, cat, paused=False)
        async with running(other):
            await wait_until(lambda: _all_done(stack, cat, len(jobs)), 15)
        assert rec.calls == {j: 1 for j in jobs}
    finally:
        await stale.close()


# -- rate limit (the API) ----------------------------------------------------------------


async def test_rate_limit_is_set_removed_and_bad_values_are_refused(
    client: httpx.AsyncClient, container: Container
) -> None:
    cat = category()
    container.scheduler.register(cat, Recorder())
    path = f"/api/job-categories/{cat}/rate-limit"
    r = await client.put(path, json={"perSecond": 50}, headers=ADMIN)
    assert r.status_code == 200, r.text
    assert r.json() == {"category": cat, "perSecond": 50}
    assert (await _overview(client))[cat]["perSecond"] == 50
    r = await client.put(path, json={"perSecond": 2.5}, headers=ADMIN)
    assert r.json() == {"category": cat, "perSecond": 2.5}
    bad: list[Any] = [
        {"perSecond": 0},
        {"perSecond": -1},
        {"perSecond": 0.0001},
        {"perSecond": 1e6},
        {"perSecond": "5"},
        {"perSecond": True},
        {"perSecond": 5, "burst": 3},
        {},
        [],
    ]
    for body in bad:
        r = await client.put(path, json=body, headers=ADMIN)
        assert (r.status_code, r.json()["code"]) == (422, "validation_error"), (body, r.text)
    for raw in (b'{"perSecond": NaN}', b'{"perSecond": 1e999}', b'{"perSecond": Infinity}'):
        r = await client.put(
            path, content=raw, headers={**ADMIN, "content-type": "application/json"}
        )
        assert (r.status_code, r.json()["code"]) == (422, "validation_error"), raw
    for role in ("service", "host"):
        r = await client.put(path, json={"perSecond": 1}, headers=auth(role, new_id()))
        assert (r.status_code, r.json()["code"]) == (403, "forbidden")
    assert (await _overview(client))[cat]["perSecond"] == 2.5  # unchanged by the refusals
    r = await client.put(path, json={"perSecond": None}, headers=ADMIN)
    assert r.json() == {"category": cat, "perSecond": None}
    assert (await _overview(client))[cat]["perSecond"] is None


async def test_a_rate_limit_holds_for_two_schedulers_together(
    stack: Stack, base_settings: Settings, own_database: str
) -> None:
    """The executors' side, in process: two schedulers (as two worker
    processes: own pools, own caches) share the category's bucket, so 10/s for
    2 s starts about 20 of the 100 jobs waiting, not twice that."""
    cat, rec = category(), Recorder()
    s = stack.container.scheduler
    assert base_settings.redis_url is not None
    second = make(own_database, base_settings.redis_url, stack.container.settings.redis_namespace)
    for each in (s, second):
        each.register(cat, rec)
    r = await stack.client.put(
        f"/api/job-categories/{cat}/rate-limit", json={"perSecond": 10}, headers=ADMIN
    )
    assert r.status_code == 200, r.text
    for _ in range(100):
        await _create(stack.client, cat, now())
    try:
        async with running(s, second):
            await wait_until(lambda: _some_ran(rec), 10, step_s=0.01)
            first = min(t[0] for t in rec.starts.values())
            await asyncio.sleep(2.0 - (datetime.now(UTC).timestamp() - first))
            started = sum(1 for t in rec.starts.values() if t[0] < first + 2.0)
    finally:
        await second.close()
    # A full bucket (one job) plus 10/s for 2 s: about 21.
    assert 17 <= started <= 23, started
    assert all(n == 1 for n in rec.calls.values())


async def _some_ran(rec: Recorder) -> bool:
    return bool(rec.calls)


# -- overview ------------------------------------------------------------------------------


async def test_the_overview_lists_declared_categories_and_those_with_jobs(stack: Stack) -> None:
    cat, quiet = category(), category()
    s = stack.container.scheduler
    s.register(cat, Recorder())
    s.register(quiet, Recorder())
    ids = [await _create(stack.client, cat, now() - timedelta(seconds=1)) for _ in range(6)]
    await _create(stack.client, cat, now() + timedelta(hours=1))  # not due: not counted
    await stack.db.execute("UPDATE scheduled_job SET status = 'RUNNING' WHERE id = $1", ids[0])
    await stack.db.execute("UPDATE scheduled_job SET status = 'DEAD' WHERE id = ANY($1)", ids[1:3])
    await stack.db.execute("UPDATE scheduled_job SET status = 'DONE' WHERE id = $1", ids[3])
    # A category with jobs but no handler in this process (an older release's).
    await stack.db.execute(
        """INSERT INTO scheduled_job (category, urgency, run_at, status, max_attempts, created_at)
           VALUES ('gone.kind', 5, now(), 'DEAD', 3, now())"""
    )
    await _pause(stack.client, quiet)
    got = await _overview(stack.client)
    assert got[cat] == {
        "category": cat,
        "paused": False,
        "perSecond": None,
        "due": 2,
        "running": 1,
        "dead": 2,
    }
    assert got["gone.kind"]["dead"] == 1
    assert got[quiet] == {
        "category": quiet,
        "paused": True,
        "perSecond": None,
        "due": 0,
        "running": 0,
        "dead": 0,
    }
    for declared in ("http", "rentals.expire-hold", "appointments.reminder"):
        assert declared in got, sorted(got)
    assert list(got) == sorted(got)
    r = await stack.client.get("/api/job-categories", headers=ADMIN)
    assert r.status_code == 200
    assert (await stack.client.get("/api/job-categories")).status_code == 401
    r = await stack.client.get("/api/job-categories", headers=auth("patient", new_id()))
    assert (r.status_code, r.json()["code"]) == (403, "forbidden")


# -- bulk retry of DEAD jobs ---------------------------------------------------------------


async def test_bulk_retry_refuses_bad_requests_and_changes_nothing(
    client: httpx.AsyncClient, container: Container
) -> None:
    cat = category()
    container.scheduler.register(cat, Recorder())
    job = await _create(client, cat, now() + timedelta(hours=1))
    async with container.db.connection() as conn:
        await conn.execute("UPDATE scheduled_job SET status = 'DEAD' WHERE id = $1", job)
    bad: list[Any] = [
        {},
        {"status": "FAILED"},
        {"status": "dead"},
        {"status": "DEAD", "category": "BAD CAT"},
        {"status": "DEAD", "category": ""},
        {"status": "DEAD", "category": cat, "limit": 1},
        [],
    ]
    for body in bad:
        r = await client.post("/api/jobs/retry", json=body, headers=ADMIN)
        assert (r.status_code, r.json()["code"]) == (422, "validation_error"), (body, r.text)
    body = {"status": "DEAD", "category": cat}
    assert (await client.post("/api/jobs/retry", json=body)).status_code == 401
    for role in ("service", "patient"):
        r = await client.post("/api/jobs/retry", json=body, headers=auth(role, new_id()))
        assert (r.status_code, r.json()["code"]) == (403, "forbidden")
    got = await client.get(f"/api/jobs/{job}", headers=SERVICE)
    assert got.json()["status"] == "DEAD"
    r = await client.post("/api/jobs/retry", json=body, headers=ADMIN)
    assert r.json() == {"retried": 1}
    r = await client.post("/api/jobs/retry", json=body, headers=ADMIN)
    assert r.json() == {"retried": 0}


async def test_two_operators_retrying_dead_jobs_together_retry_each_once(stack: Stack) -> None:
    cat, other, rec = category(), category(), Recorder()
    s = stack.container.scheduler
    s.register(cat, rec)
    s.register(other, rec)
    # Pages of 7: the requests interleave page by page.
    s.retry_batch = 7
    dead = [await _create(stack.client, cat, now() + timedelta(hours=1)) for _ in range(40)]
    spared = [await _create(stack.client, other, now() + timedelta(hours=1)) for _ in range(3)]
    await stack.db.execute(
        """UPDATE scheduled_job SET status = 'DEAD', attempts = 3, max_attempts = 3,
                  finished_at = now() WHERE id = ANY($1)""",
        dead + spared,
    )
    before = {
        r["id"]: r["revision"]
        for r in await stack.db.fetch(
            "SELECT id, revision FROM scheduled_job WHERE id = ANY($1)", dead
        )
    }
    barrier = asyncio.Barrier(6)

    async def retry() -> httpx.Response:
        await barrier.wait()
        body = {"status": "DEAD", "category": cat}
        return await stack.client.post("/api/jobs/retry", json=body, headers=ADMIN)

    answers = await asyncio.gather(*(retry() for _ in range(6)))
    assert all(r.status_code == 200 for r in answers), [r.text for r in answers]
    assert sum(r.json()["retried"] for r in answers) == len(dead)
    rows = await stack.db.fetch(
        "SELECT id, status, revision, max_attempts FROM scheduled_job WHERE id = ANY($1)", dead
    )
    for row in rows:  # one transition each: a second retry would bump the revision again
        assert row["status"] in ("SCHEDULED", "QUEUED"), dict(row)
        assert row["revision"] == before[row["id"]] + 1, dict(row)
        assert row["max_attempts"] == 3 + s.config.max_attempts
    assert await statuses(stack.db, other) == {"DEAD": 3}  # another category: untouched
    async with running(s):
        await wait_until(lambda: _all_done(stack, cat, len(dead)), 20)
        await asyncio.sleep(0.3)  # a second run would show here
    assert rec.calls == {j: 1 for j in dead}
    runs = await stack.db.fetch(
        "SELECT job_id, attempt, outcome FROM job_execution WHERE job_id = ANY($1)", dead
    )
    assert sorted((r["job_id"], r["attempt"], r["outcome"]) for r in runs) == sorted(
        (j, 4, "DONE") for j in dead
    )
    # Without a category: the rest (the other category's) are retried.
    r = await stack.client.post("/api/jobs/retry", json={"status": "DEAD"}, headers=ADMIN)
    assert r.json() == {"retried": 3}
