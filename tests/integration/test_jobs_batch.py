"""POST /api/jobs as a group commit (scheduler/batch.py): the enqueues a process
receives together commit in one transaction and go to Redis together, each
answered exactly as alone; a refusal in a batch is its own request's; a client
cut off mid-flight does not cancel the batch it joined; the database down is
503 and nothing; a batch rolled back as a whole runs again."""

from __future__ import annotations

import asyncio
import uuid
from datetime import UTC, datetime, timedelta
from typing import Any

import asyncpg
import httpx
import orjson
import pytest

from reservo.bootstrap import Container
from reservo.core.http.auth import Principal
from reservo.core.http.batching import Outcome
from reservo.core.http.idempotency import IdempotencyStore, request_hash
from reservo.core.kernel.clock import SystemClock
from reservo.core.kernel.errors import DomainError
from reservo.core.redis.client import make_client
from reservo.scheduler import Scheduler, SchedulerSettings
from reservo.scheduler.api import created
from reservo.scheduler.batch import Answer, JobBatch, JobRequest
from reservo.scheduler.domain import Job
from reservo.scheduler.setup import SchedulerModule
from reservo.scheduler.workers import Loader
from tests.helpers.auth import auth
from tests.helpers.batching import (
    assert_all_unavailable,
    assert_grouped,
    assert_stored_and_replayed,
    unreachable_database,
)
from tests.helpers.http import post_together

SERVICE = auth("service", 1)
REQUESTS = 40


def _job(marker: str, **extra: Any) -> dict[str, Any]:
    """An http job due in 4 minutes (inside the window: pushed to Redis at once)."""
    return {
        "category": "http",
        "delayMs": 240_000,
        "payload": {"url": "https://callbacks.example.com/hook", "body": {"m": marker}},
        **extra,
    }


async def _in_redis(container: Container, job_ids: list[int]) -> None:
    """Every job is QUEUED (pushed) and its id is in its future set."""
    s = container.scheduler
    rows = await _rows(container, job_ids)
    for row in rows:
        assert row["status"] == "QUEUED", dict(row)
        future = s.keys.future(row["category"], row["urgency"])
        assert await s.redis.zscore(future, str(row["id"])) is not None, row["id"]


async def _rows(container: Container, job_ids: list[int]) -> list[asyncpg.Record]:
    async with container.db.connection() as conn:
        return list(
            await conn.fetch(
                "SELECT id, status, category, urgency, payload FROM scheduled_job"
                " WHERE id = ANY($1::bigint[]) ORDER BY id",
                job_ids,
            )
        )


async def test_jobs_released_together_share_transactions_and_a_push(
    container: Container, client: httpx.AsyncClient, db: asyncpg.Connection
) -> None:
    markers = [str(uuid.uuid4()) for _ in range(REQUESTS)]
    calls = []
    for n, marker in enumerate(markers):
        # Every third one without a key: those join the batches too.
        headers = SERVICE if n % 3 == 2 else {**SERVICE, "Idempotency-Key": str(uuid.uuid4())}
        calls.append((_job(marker, urgency=n % 10), headers))
    responses = await post_together(client, "/api/jobs", calls)
    assert [r.status_code for r in responses] == [201] * REQUESTS, [r.text for r in responses]
    ids = [r.json()["jobId"] for r in responses]
    assert len(set(ids)) == REQUESTS
    await assert_grouped(db, "scheduled_job", ids)
    # Each 201 names exactly its own job, and its key stored exactly that answer.
    for (body, headers), r in zip(calls, responses, strict=True):
        row = await db.fetchrow(
            "SELECT urgency, payload, status FROM scheduled_job WHERE id = $1", r.json()["jobId"]
        )
        assert row["urgency"] == body["urgency"]
        assert orjson.loads(row["payload"]) == body["payload"]
        # Due within the window: written QUEUED (handed to Redis), and the 201
        # is sent once it is in Redis.
        assert r.json()["status"] == "QUEUED"
        key = headers.get("Idempotency-Key")
        if key is None:
            continue
        await assert_stored_and_replayed(client, db, "/api/jobs", body, headers, r)
    per_marker = await db.fetch(
        "SELECT payload->'body'->>'m' AS m, count(*) AS n FROM scheduled_job"
        " WHERE payload->'body'->>'m' = ANY($1) GROUP BY 1",
        markers,
    )
    assert {r["m"]: r["n"] for r in per_marker} == dict.fromkeys(markers, 1)
    await _in_redis(container, ids)


async def test_refusals_in_a_batch_are_each_requests_own(
    container: Container, client: httpx.AsyncClient, db: asyncpg.Connection
) -> None:
    """One batch: good enqueues, each kind of refusal that comes after the key,
    and the same key twice. Each answer is the one the request gets alone; the
    refusals create nothing and the others are unaffected."""
    m = [str(uuid.uuid4()) for _ in range(9)]

    def keyed(body: dict[str, Any], key: str | None = None) -> Any:
        return body, {**SERVICE, "Idempotency-Key": key or str(uuid.uuid4())}

    dup = f"dup-{uuid.uuid4()}"
    far = (datetime.now(UTC) + timedelta(days=3650)).isoformat()
    credentials = {"url": "https://user:secret@example.com/hook", "body": {"m": m[3]}}
    calls = [
        keyed(_job(m[0])),  # 201
        keyed({**_job(m[1]), "category": "no.such.handler"}),  # 422 unknown_category
        (_job(m[2]) | {"category": "no.such.handler"}, SERVICE),  # the same, without a key
        keyed({**_job(m[3]), "payload": credentials}),  # 422 destination_not_allowed
        keyed({"category": "http", "runAt": far, "payload": _job(m[4])["payload"]}),  # 422 time
        keyed(_job(m[5]), dup),  # the same key twice: one job
        keyed(_job(m[5]), dup),
        (_job(m[6]), SERVICE),  # 201 without a key
        keyed(_job(m[7])),  # 201
    ]
    r = await post_together(client, "/api/jobs", calls)
    got = [(x.status_code, x.json().get("code")) for x in r]
    assert got[0] == (201, None)
    assert got[1] == (422, "unknown_category")
    assert r[1].json()["detail"] == "no handler for category 'no.such.handler'"
    assert got[2] == (422, "unknown_category")
    assert got[3] == (422, "destination_not_allowed")
    assert got[4] == (422, "validation_error")
    assert r[4].json()["detail"] == "run_at is too far in the future"
    assert sorted(s for s, _ in got[5:7]) == [200, 201]  # the duplicate waits, replays
    assert got[7] == (201, None)
    assert got[8] == (201, None)
    dup_ids = {x.json()["jobId"] for x in r[5:7]}
    assert len(dup_ids) == 1
    # Every stored refusal replays as it was answered.
    for (body, headers), x in zip(calls, r, strict=True):
        if "Idempotency-Key" not in headers:
            continue
        again = await client.post("/api/jobs", json=body, headers=headers)
        if x.status_code == 201:
            assert (again.status_code, again.json()) == (200, x.json())
        else:
            assert (again.status_code, again.json()) == (x.status_code, x.json())
    rows = await db.fetch(
        "SELECT payload->'body'->>'m' AS m, count(*) AS n FROM scheduled_job"
        " WHERE payload->'body'->>'m' = ANY($1) GROUP BY 1",
        m,
    )
    assert {row["m"]: row["n"] for row in rows} == {m[0]: 1, m[5]: 1, m[6]: 1, m[7]: 1}
    await _in_redis(container, [x.json()["jobId"] for x in r if x.status_code == 201])


def _request(marker: str, key: str | None) -> JobRequest:
    body = _job(marker)
    return JobRequest(
        Principal(sub=1, role="service"),
        key,
        request_hash(orjson.dumps(body)),
        body["category"],
        body["payload"],
        5,
        None,
        timedelta(milliseconds=body["delayMs"]),
    )


async def test_a_cut_off_request_does_not_cancel_its_batch(
    container: Container, client: httpx.AsyncClient, db: asyncpg.Connection
) -> None:
    batch = container.module(SchedulerModule).jobs_batch
    marker, key = str(uuid.uuid4()), f"cut-{uuid.uuid4()}"
    task = asyncio.create_task(batch.submit(_request(marker, key)))
    await asyncio.sleep(0)  # submitted: the request waits for its batch
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    await batch.close()  # the batch it joined runs to its end
    stored = await db.fetchrow(
        "SELECT status, response_status, response_body FROM idempotency_key WHERE key = $1", key
    )
    assert (stored["status"], stored["response_status"]) == ("DONE", 201)
    job_id = orjson.loads(stored["response_body"])["jobId"]
    rows = await db.fetch("SELECT id FROM scheduled_job WHERE payload->'body'->>'m' = $1", marker)
    assert [row["id"] for row in rows] == [job_id]
    # The retry learns what happened to it.
    again = await client.post(
        "/api/jobs", json=_job(marker), headers={**SERVICE, "Idempotency-Key": key}
    )
    assert (again.status_code, again.json()) == (200, orjson.loads(stored["response_body"]))
    # Its push went on without it.
    for _ in range(100):
        if (await _rows(container, [job_id]))[0]["status"] == "QUEUED":
            break
        await asyncio.sleep(0.01)
    await _in_redis(container, [job_id])


async def test_the_database_down_is_503_for_each_request_and_creates_nothing(
    container: Container, db: asyncpg.Connection
) -> None:
    down = unreachable_database()
    clock = SystemClock()
    scheduler = Scheduler(down, clock, container.scheduler.redis, "test-down", SchedulerSettings())
    scheduler.handlers = container.scheduler.handlers
    batch = JobBatch(scheduler, IdempotencyStore(down, clock), created)
    markers = [str(uuid.uuid4()) for _ in range(5)]
    keys = [f"down-{uuid.uuid4()}" if n % 2 else None for n in range(5)]
    results = await asyncio.gather(
        *(batch.submit(_request(m, k)) for m, k in zip(markers, keys, strict=True)),
        return_exceptions=True,
    )
    assert_all_unavailable(results)
    assert not await db.fetchval(
        "SELECT count(*) FROM idempotency_key WHERE key = ANY($1)", [k for k in keys if k]
    )
    assert not await db.fetchval(
        "SELECT count(*) FROM scheduled_job WHERE payload->'body'->>'m' = ANY($1)", markers
    )
    await down.close()


class _DeadlockOnce(JobBatch):
    """A batch whose first transaction dies of a deadlock after writing."""

    failed = False

    async def _once(self, items: list[JobRequest]) -> list[Outcome[Answer]]:
        if not self.failed:
            self.failed = True
            async with self.scheduler.db.transaction() as conn:
                await conn.execute(
                    "INSERT INTO scheduled_job (category, urgency, run_at, payload, status,"
                    " max_attempts, created_at) VALUES ('http', 5, now(), $1, 'SCHEDULED', 1,"
                    " now())",
                    _job(self.marker)["payload"],
                )
                raise asyncpg.exceptions.DeadlockDetectedError("deadlock detected")
        return await super()._once(items)

    marker = ""


async def test_a_batch_rolled_back_as_a_whole_is_run_again(
    container: Container, db: asyncpg.Connection
) -> None:
    batch = _DeadlockOnce(container.scheduler, container.idempotency, created)
    marker = batch.marker = str(uuid.uuid4())
    keys = [f"retry-{uuid.uuid4()}" for _ in range(3)]
    answers = await asyncio.gather(*(batch.submit(_request(marker, k)) for k in keys))
    assert batch.failed and batch.transactions == 2
    assert [a.status for a in answers] == [201] * 3
    rows = await db.fetch("SELECT id FROM scheduled_job WHERE payload->'body'->>'m' = $1", marker)
    assert sorted(row["id"] for row in rows) == sorted(a.body["jobId"] for a in answers)
    await _in_redis(container, [a.body["jobId"] for a in answers])


async def test_a_check_refusing_as_forbidden_is_not_stored_for_its_key(
    container: Container, client: httpx.AsyncClient, db: asyncpg.Connection
) -> None:
    """A refusal that is not stored (401/403/429/503) drops the key's claim in
    the batch's transaction: a retry is checked again, and the others commit."""

    async def handler(job: Any) -> None:
        return None

    def check(payload: dict[str, Any]) -> None:
        if payload.get("deny"):
            raise DomainError("forbidden", "not this one")

    container.scheduler.register("test.forbid", handler, check)
    denied = {"category": "test.forbid", "payload": {"deny": True}}
    allowed = {"category": "test.forbid", "payload": {"deny": False, "m": str(uuid.uuid4())}}
    keys = [f"forbid-{uuid.uuid4()}" for _ in range(2)]
    calls = [
        (denied, {**SERVICE, "Idempotency-Key": keys[0]}),
        (allowed, {**SERVICE, "Idempotency-Key": keys[1]}),
    ]
    r = await post_together(client, "/api/jobs", calls)
    assert (r[0].status_code, r[0].json()["code"]) == (403, "forbidden")
    assert r[1].status_code == 201
    assert not await db.fetchval("SELECT count(*) FROM idempotency_key WHERE key = $1", keys[0])
    again = await client.post("/api/jobs", json=denied, headers=calls[0][1])
    assert (again.status_code, again.json()) == (403, r[0].json())
    replay = await client.post("/api/jobs", json=allowed, headers=calls[1][1])
    assert (replay.status_code, replay.json()) == (200, r[1].json())


# -- the push after commit, and its recovery (job_push, migration 0027) --------


class _DiesBeforePush(Scheduler):
    """A process that dies between a batch's commit and its push: the jobs are
    committed, nothing reaches Redis, nothing is cleaned up."""

    def push_soon(self, jobs: Any, push_id: int) -> asyncio.Future[None]:
        done = asyncio.get_running_loop().create_future()
        done.set_result(None)
        return done


def _scheduler(
    container: Container, kind: type[Scheduler], ns: str, grace_s: float, redis: Any = None
) -> Scheduler:
    s = kind(
        container.db,
        SystemClock(),
        redis or container.scheduler.redis,
        ns,
        SchedulerSettings(push_grace_s=grace_s),
    )
    s.handlers = container.scheduler.handlers
    return s


async def _pending_push(db: asyncpg.Connection, job_ids: list[int]) -> list[asyncpg.Record]:
    """The job_push rows naming any of these jobs."""
    return list(
        await db.fetch(
            "SELECT id, job_ids FROM job_push WHERE job_ids && $1::bigint[] ORDER BY id", job_ids
        )
    )


async def _in_future_set(s: Scheduler, job: Job | dict[str, Any]) -> bool:
    if isinstance(job, Job):
        category, urgency, job_id = job.category, job.urgency, job.id
    else:
        category, urgency, job_id = job["category"], job["urgency"], job["id"]
    return await s.redis.zscore(s.keys.future(category, urgency), str(job_id)) is not None


async def test_jobs_committed_but_never_pushed_are_pushed_by_the_loader(
    container: Container, db: asyncpg.Connection
) -> None:
    """The process dies after the commit, before the push: its jobs are QUEUED
    in PostgreSQL but not in Redis, and not in the loader's unpushed scan
    either; their job_push row is. Once the row is older than the grace, the
    loader pushes them and deletes it (and not before: a push in progress is
    left to finish)."""
    ns = f"test-push-{uuid.uuid4().hex[:8]}"
    dying = _scheduler(container, _DiesBeforePush, ns, grace_s=3600)
    batch = JobBatch(dying, container.idempotency, created)
    marker = str(uuid.uuid4())
    keys = [f"crash-{uuid.uuid4()}" for _ in range(5)]
    answers = await asyncio.gather(*(batch.submit(_request(marker, k)) for k in keys))
    assert [a.status for a in answers] == [201] * 5
    ids = [a.body["jobId"] for a in answers]
    rows = await db.fetch(
        "SELECT id, category, urgency, status, pushed FROM scheduled_job"
        " WHERE id = ANY($1::bigint[])",
        ids,
    )
    assert {(r["status"], r["pushed"]) for r in rows} == {("QUEUED", True)}
    assert not [r for r in rows if await _in_future_set(dying, dict(r))]
    pushes = await _pending_push(db, ids)
    assert sorted(i for p in pushes for i in p["job_ids"]) == sorted(ids)

    # Within the grace the loader leaves the row alone (its push may be running).
    assert await Loader(dying).unfinished_pushes() == 0
    assert await _pending_push(db, ids) == pushes

    recovering = _scheduler(container, Scheduler, ns, grace_s=0)
    assert await Loader(recovering).unfinished_pushes() >= len(ids)
    assert all([await _in_future_set(recovering, dict(r)) for r in rows])
    assert await _pending_push(db, ids) == []
    # Replays still answer the 201 each key got.
    for key, answer in zip(keys, answers, strict=True):
        again = await batch.submit(_request(marker, key))
        assert (again.status, again.body) == (200, answer.body)


async def test_a_push_that_fails_is_left_to_the_loader(
    container: Container, db: asyncpg.Connection
) -> None:
    """Redis away at the push: the requests still get their 201 (the jobs are
    committed), the job_push row stays, and the loader pushes them later."""
    ns = f"test-push-{uuid.uuid4().hex[:8]}"
    away = make_client("redis://127.0.0.1:1/0", 0.2)
    cut_off = _scheduler(container, Scheduler, ns, grace_s=0, redis=away)
    batch = JobBatch(cut_off, container.idempotency, created)
    marker = str(uuid.uuid4())
    answers = await asyncio.gather(
        *(batch.submit(_request(marker, f"away-{uuid.uuid4()}")) for _ in range(3))
    )
    assert [a.status for a in answers] == [201] * 3
    ids = [a.body["jobId"] for a in answers]
    assert cut_off.take_pushes_done() == []  # nothing was pushed
    assert len(await _pending_push(db, ids)) == 1
    recovering = _scheduler(container, Scheduler, ns, grace_s=0)
    assert await Loader(recovering).unfinished_pushes() >= len(ids)
    for job_id in ids:
        job = await recovering.get(job_id)
        assert job.status == "QUEUED" and await _in_future_set(recovering, job)
    assert await _pending_push(db, ids) == []
    await away.aclose()


async def test_a_finished_push_is_forgotten_by_the_next_batch(
    container: Container, db: asyncpg.Connection
) -> None:
    """No statement after the push: the job_push row of a batch whose jobs
    reached Redis is deleted by the process's next batch (or at close), so the
    loader never pushes them again."""
    ns = f"test-push-{uuid.uuid4().hex[:8]}"
    s = _scheduler(container, Scheduler, ns, grace_s=3600)
    batch = JobBatch(s, container.idempotency, created)
    key = f"forget-{uuid.uuid4()}"
    first = await batch.submit(_request("first", key))
    assert len(await _pending_push(db, [first.body["jobId"]])) == 1
    second = await batch.submit(_request(str(uuid.uuid4()), None))
    assert await _pending_push(db, [first.body["jobId"]]) == []
    assert len(await _pending_push(db, [second.body["jobId"]])) == 1
    # A batch that creates no job (a replay) still deletes the rows of pushes done.
    again = await batch.submit(_request("first", key))
    assert (again.status, again.body) == (200, first.body)
    assert await _pending_push(db, [second.body["jobId"]]) == []
    third = await batch.submit(_request(str(uuid.uuid4()), None))
    await batch.close()
    await s.close()
    assert await _pending_push(db, [third.body["jobId"]]) == []


async def test_jobs_beyond_the_window_are_left_to_the_loader_as_before(
    container: Container, db: asyncpg.Connection
) -> None:
    """A job due after the window is SCHEDULED, not pushed, in no job_push row:
    the loader's unpushed scan hands it to Redis when it comes into the window."""
    ns = f"test-push-{uuid.uuid4().hex[:8]}"
    s = _scheduler(container, Scheduler, ns, grace_s=0)
    batch = JobBatch(s, container.idempotency, created)
    far = JobRequest(
        Principal(sub=1, role="service"),
        None,
        b"",
        "http",
        _job("far")["payload"],
        5,
        None,
        timedelta(hours=2),
    )
    answer = await batch.submit(far)
    assert (answer.status, answer.body["status"]) == (201, "SCHEDULED")
    job_id = answer.body["jobId"]
    row = await db.fetchrow("SELECT status, pushed FROM scheduled_job WHERE id = $1", job_id)
    assert (row["status"], row["pushed"]) == ("SCHEDULED", False)
    assert await _pending_push(db, [job_id]) == []


class _RacedStore(IdempotencyStore):
    """Before it writes its answers, another process's batch enqueues under the
    same key and commits (the key was free when this batch read it)."""

    rival: JobBatch | None = None
    rival_answer: Answer | None = None
    request: JobRequest | None = None

    async def store_many(self, conn: Any, *args: Any, **kwargs: Any) -> set[tuple[str, str]]:
        if self.rival is not None and self.rival_answer is None:
            assert self.request is not None
            self.rival_answer = await self.rival.submit(self.request)
        return await super().store_many(conn, *args, **kwargs)


async def test_a_key_written_by_another_process_meanwhile_keeps_its_answer(
    container: Container, db: asyncpg.Connection
) -> None:
    """Free keys are not claimed before their answers are written: when another
    process's batch commits the same key in between, this batch's job for it is
    deleted, and the request is answered (in the next batch) with the other's
    job, as a replay. One job, one stored answer."""
    marker, key = str(uuid.uuid4()), f"race-{uuid.uuid4()}"
    request = _request(marker, key)
    raced = _RacedStore(container.db, SystemClock())
    raced.rival = JobBatch(container.scheduler, container.idempotency, created)
    raced.request = request
    batch = JobBatch(container.scheduler, raced, created)
    answer = await batch.submit(request)
    assert raced.rival_answer is not None and raced.rival_answer.status == 201
    assert (answer.status, answer.body) == (200, raced.rival_answer.body)
    assert batch.transactions == 2  # the raced one, then the replay
    rows = await db.fetch("SELECT id FROM scheduled_job WHERE payload->'body'->>'m' = $1", marker)
    assert [r["id"] for r in rows] == [raced.rival_answer.body["jobId"]]
    stored = await db.fetch(
        "SELECT response_status, response_body FROM idempotency_key WHERE key = $1", key
    )
    assert [(r["response_status"], orjson.loads(r["response_body"])) for r in stored] == [
        (201, raced.rival_answer.body)
    ]
    await _in_redis(container, [raced.rival_answer.body["jobId"]])


async def test_a_claim_left_by_the_two_commit_path_is_409_then_taken_over(
    container: Container, db: asyncpg.Connection
) -> None:
    """A key claimed IN_PROGRESS by ``begin`` (a process of an older release)
    answers 409 (past the wait) while its lease runs; after, the batch takes the claim over,
    creates the job and completes the claim with its answer (stored, replayed)."""
    batch = container.module(SchedulerModule).jobs_batch
    marker, key = str(uuid.uuid4()), f"leased-{uuid.uuid4()}"
    body = orjson.dumps(_job(marker))
    await container.idempotency.begin("1", "POST /api/jobs", key, body)
    request = _request(marker, key)
    with pytest.raises(DomainError) as busy:
        await batch.submit(request)
    assert busy.value.code == "request_in_progress"
    await db.execute(
        "UPDATE idempotency_key SET locked_until = locked_until - interval '1 hour' WHERE key = $1",
        key,
    )
    answer = await batch.submit(request)
    assert answer.status == 201
    stored = await db.fetchrow(
        "SELECT status, response_status, response_body FROM idempotency_key WHERE key = $1", key
    )
    assert (stored["status"], stored["response_status"]) == ("DONE", 201)
    assert orjson.loads(stored["response_body"]) == answer.body
    again = await batch.submit(request)
    assert (again.status, again.body) == (200, answer.body)
