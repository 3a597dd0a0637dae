"""Unique and dependent jobs through HTTP, on the real PostgreSQL and Redis with
real workers: ``uniqueKey`` (one unfinished job per category and key, also for
50 posts released together into two processes' batches) and ``after`` (a job
is due once every parent is DONE; a DEAD or CANCELLED parent cancels it and its
own dependents; ``unknown_dependency``; a chain of 1,000 runs in order, once
each; children posted while their parents complete are never left waiting)."""

from __future__ import annotations

import asyncio
import re
from collections.abc import AsyncIterator
from datetime import UTC, datetime, timedelta
from typing import Any

import asyncpg
import httpx
import pytest

from reservo.bootstrap import Container
from reservo.core.http.auth import Principal
from reservo.scheduler.batch import Answer, JobRequest
from reservo.scheduler.domain import Extras
from reservo.scheduler.setup import SchedulerModule
from reservo.settings import Settings
from tests.helpers.auth import auth, token
from tests.helpers.console import sign_in
from tests.helpers.scheduler import Recorder, Stack, api_stack, category, running
from tests.helpers.waiting import wait_until

SERVICE = auth("service", 1)
FAR = datetime.now(UTC) + timedelta(days=30)


@pytest.fixture
async def stack(base_settings: Settings, own_database: str) -> AsyncIterator[Stack]:
    # One attempt: a failing handler makes its job DEAD at once.
    async with api_stack(
        base_settings, own_database, scheduler_window_s=300, scheduler_max_attempts=1
    ) as s:
        yield s


async def _post(client: httpx.AsyncClient, body: dict[str, Any]) -> httpx.Response:
    return await client.post(
        "/api/jobs", json={"urgency": 5, "payload": {}, **body}, headers=SERVICE
    )


async def _create(client: httpx.AsyncClient, cat: str, **extra: Any) -> int:
    r = await _post(client, {"category": cat, **extra})
    assert r.status_code == 201, r.text
    assert r.json()["deduplicated"] is False
    return int(r.json()["jobId"])


async def _job(client: httpx.AsyncClient, job_id: int) -> dict[str, Any]:
    r = await client.get(f"/api/jobs/{job_id}", headers=SERVICE)
    assert r.status_code == 200, r.text
    return dict(r.json())


async def _count(db: asyncpg.Connection, cat: str) -> int:
    return int(await db.fetchval("SELECT count(*) FROM scheduled_job WHERE category = $1", cat))


# -- uniqueKey ------------------------------------------------------------------------


async def test_unique_key_answers_the_unfinished_job(stack: Stack) -> None:
    client, cat = stack.client, category()
    stack.container.scheduler.register(cat, Recorder())
    first = await _create(client, cat, uniqueKey="nightly", runAt=FAR.isoformat())
    again = await _post(client, {"category": cat, "uniqueKey": "nightly", "delayMs": 5})
    assert again.status_code == 200, again.text
    assert again.json()["jobId"] == first and again.json()["deduplicated"] is True
    assert again.json()["status"] == "SCHEDULED"
    # Another key, or another category, is another job.
    other = await _create(client, cat, uniqueKey="hourly", runAt=FAR.isoformat())
    http = await _post(
        client,
        {
            "category": "http",
            "uniqueKey": "nightly",
            "runAt": FAR.isoformat(),
            "payload": {"url": "http://x.test/"},
        },
    )
    assert http.status_code == 201 and http.json()["jobId"] not in (first, other)
    assert await _count(stack.db, cat) == 2
    # Finished (here: cancelled), the key is free again.
    assert (await client.delete(f"/api/jobs/{first}", headers=SERVICE)).status_code == 200
    fresh = await _create(client, cat, uniqueKey="nightly", runAt=FAR.isoformat())
    assert fresh != first
    r = await _post(client, {"category": cat, "uniqueKey": "k" * 201})
    assert (r.status_code, r.json()["code"]) == (422, "validation_error")
    assert await _count(stack.db, cat) == 3


async def test_fifty_posts_of_one_key_released_together_make_one_job(
    stack: Stack, base_settings: Settings, own_database: str
) -> None:
    """Two processes (two batchers, so both the in-batch repeat and the
    conflict between transactions are exercised), 50 clients at a barrier."""
    cat = category()
    async with api_stack(base_settings, own_database, scheduler_window_s=300) as other:
        for s in (stack, other):
            s.container.scheduler.register(cat, Recorder())
        clients = [stack.client, other.client]
        barrier = asyncio.Barrier(50)

        async def post(n: int) -> httpx.Response:
            await barrier.wait()
            body = {"category": cat, "uniqueKey": "once", "runAt": FAR.isoformat()}
            return await _post(clients[n % 2], body)

        answers = await asyncio.gather(*(post(n) for n in range(50)))
    assert all(r.status_code in (200, 201) for r in answers), [r.text for r in answers]
    assert len({r.json()["jobId"] for r in answers}) == 1
    assert [r.status_code for r in answers].count(201) == 1
    assert sum(r.json()["deduplicated"] for r in answers) == 49
    assert await _count(stack.db, cat) == 1


# -- after ----------------------------------------------------------------------------


async def test_unknown_dependency_is_refused_and_creates_nothing(stack: Stack) -> None:
    client, cat = stack.client, category()
    stack.container.scheduler.register(cat, Recorder())
    parent = await _create(client, cat, runAt=FAR.isoformat())
    r = await _post(client, {"category": cat, "after": [parent, 9_000_000_000_000]})
    assert (r.status_code, r.json()["code"]) == (422, "unknown_dependency"), r.text
    assert r.headers["content-type"].startswith("application/problem+json")
    r = await _post(client, {"category": cat, "after": list(range(1, 102))})
    assert (r.status_code, r.json()["code"]) == (422, "validation_error")
    assert await _count(stack.db, cat) == 1


async def test_a_child_runs_only_once_every_parent_is_done(stack: Stack) -> None:
    client, s, cat = stack.client, stack.container.scheduler, category()
    rec = Recorder()
    s.register(cat, rec)
    soon = (datetime.now(UTC) + timedelta(seconds=1.5)).isoformat()
    a = await _create(client, cat, runAt=soon)
    b = await _create(client, cat, delayMs=0)
    child = await _create(client, cat, after=[a, b, a])
    waiting = await _job(client, child)
    assert waiting["status"] == "SCHEDULED"
    listed = await client.get(f"/api/jobs?status=SCHEDULED&category={cat}", headers=SERVICE)
    assert child in [j["jobId"] for j in listed.json()["items"]]
    async with running(s):
        await wait_until(lambda: b in rec.calls, what="b ran")
        await asyncio.sleep(0.5)  # b is DONE, a not yet: the child still waits
        assert child not in rec.calls
        await wait_until(lambda: child in rec.calls, timeout_s=15, what="the child ran")
    assert rec.calls[child] == 1
    parent_a = await _job(client, a)
    assert rec.starts[child][0] >= datetime.fromisoformat(parent_a["finishedAt"]).timestamp()
    assert (await _job(client, child))["status"] == "DONE"


async def test_a_chain_of_1000_runs_in_order_once_each(stack: Stack) -> None:
    client, s, cat = stack.client, stack.container.scheduler, category()
    rec = Recorder()
    s.register(cat, rec)
    chain = [await _create(client, cat)]
    for _ in range(999):
        chain.append(await _create(client, cat, after=[chain[-1]]))
    async with running(s):
        await wait_until(
            lambda: chain[-1] in rec.calls, timeout_s=300, step_s=0.5, what="the chain's end ran"
        )
    assert [rec.calls[j] for j in chain] == [1] * 1000
    started = [rec.starts[j][0] for j in chain]
    assert started == sorted(started)
    assert sorted(rec.calls, key=lambda j: rec.starts[j][0]) == chain


async def test_a_dead_parent_cancels_its_dependents_in_cascade(stack: Stack) -> None:
    client, s = stack.client, stack.container.scheduler
    bad, good = category(), category()
    failing, rec = Recorder(fail=True), Recorder()
    s.register(bad, failing)
    s.register(good, rec)
    soon = (datetime.now(UTC) + timedelta(seconds=1)).isoformat()
    parent = await _create(client, bad, runAt=soon)
    child = await _create(client, good, after=[parent])
    grandchild = await _create(client, good, after=[child])
    bystander = await _create(client, good, delayMs=0)
    async with running(s):
        await wait_until(lambda: bystander in rec.calls and parent in failing.calls)

        async def settled() -> bool:
            return (await _job(client, grandchild))["status"] == "CANCELLED"

        await wait_until(settled, what="the grandchild cancelled")
        assert (await _job(client, parent))["status"] == "DEAD"
        for job_id in (child, grandchild):
            job = await _job(client, job_id)
            assert (job["status"], job["lastError"]) == ("CANCELLED", "dependency_failed")
        # A job created after a DEAD parent is cancelled at once.
        late = await _post(client, {"category": good, "after": [parent]})
        assert late.status_code == 201 and late.json()["status"] == "CANCELLED"
        assert (await _job(client, late.json()["jobId"]))["lastError"] == "dependency_failed"
        await asyncio.sleep(0.5)
    assert child not in rec.calls and grandchild not in rec.calls


async def test_cancelling_a_parent_cancels_its_dependents(stack: Stack) -> None:
    client, cat = stack.client, category()
    stack.container.scheduler.register(cat, Recorder())
    parent = await _create(client, cat, runAt=FAR.isoformat())
    child = await _create(client, cat, after=[parent])
    grandchild = await _create(client, cat, after=[child])
    r = await client.delete(f"/api/jobs/{parent}", headers=SERVICE)
    assert r.status_code == 200 and r.json()["status"] == "CANCELLED"
    for job_id in (child, grandchild):
        job = await _job(client, job_id)
        assert (job["status"], job["lastError"]) == ("CANCELLED", "dependency_failed")


async def test_children_posted_while_their_parents_complete_all_run(stack: Stack) -> None:
    """The race between a parent's completion and the creation of a child
    naming it: whichever commits first, the child is never left waiting."""
    client, s, cat = stack.client, stack.container.scheduler, category()
    rec = Recorder()
    s.register(cat, rec)
    parents = [await _create(client, cat, delayMs=0) for _ in range(50)]
    async with running(s):
        barrier = asyncio.Barrier(50)

        async def child(parent: int) -> int:
            await barrier.wait()
            await asyncio.sleep(0.002 * (parent % 20))
            return await _create(client, cat, after=[parent])

        children = await asyncio.gather(*(child(p) for p in parents))
        await wait_until(
            lambda: all(c in rec.calls for c in children), timeout_s=20, what="every child ran"
        )
    assert all(rec.calls[j] == 1 for j in [*parents, *children])


# -- the console ----------------------------------------------------------------------


async def test_the_console_job_page_shows_key_dependencies_and_dependents(
    client: httpx.AsyncClient, container: Container
) -> None:
    cat = category()
    container.scheduler.register(cat, Recorder())
    parent = await _create(client, cat, runAt=FAR.isoformat())
    job = await _create(client, cat, uniqueKey="report-42", after=[parent])
    child = await _create(client, cat, after=[job])
    await sign_in(client, token("admin", 1))
    page = await client.get(f"/console/jobs/{job}")
    assert page.status_code == 200
    html = page.text
    assert re.search(r'id="job-unique-key">report-42<', html)
    parents = html[html.index('id="job-parents"') : html.index('id="job-children"')]
    children = html[html.index('id="job-children"') :]
    assert f'href="/console/jobs/{parent}"' in parents and "SCHEDULED" in parents
    assert f'href="/console/jobs/{child}"' in children and "WAITING" in children
    assert f'href="/console/jobs/{child}"' not in parents


async def test_two_posts_of_one_key_in_one_batch_make_one_job(
    container: Container, db: asyncpg.Connection
) -> None:
    """The group commit's one transaction (scheduler/batch.py) given two
    requests of one key, and a third of another: two jobs, the repeat answered
    200 with the first one's."""
    cat = category()
    container.scheduler.register(cat, Recorder())
    batch = container.module(SchedulerModule).jobs_batch

    def request(key: str) -> JobRequest:
        return JobRequest(
            Principal(sub=1, role="service"), None, b"", cat, {}, 5, FAR, None, Extras(key)
        )

    first, repeat, other = await batch._once([request("a"), request("a"), request("b")])
    assert isinstance(first, Answer) and isinstance(repeat, Answer) and isinstance(other, Answer)
    assert (first.status, repeat.status, other.status) == (201, 200, 201)
    assert repeat.body["jobId"] == first.body["jobId"] and repeat.body["deduplicated"] is True
    assert other.body["jobId"] != first.body["jobId"]
    assert await _count(db, cat) == 2
