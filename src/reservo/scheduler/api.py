"""HTTP routes of the Delayed jobs API: parse, authorize, call the service, render."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from datetime import timedelta
from typing import Annotated, Any, Literal

import orjson
from fastapi import APIRouter, Path, Query, Request, Response
from fastapi.responses import JSONResponse

from reservo.core.http.auth import Principal
from reservo.core.http.callers import AdminCaller, role_caller
from reservo.core.http.idempotency import Within, request_hash, validate_key
from reservo.core.http.idempotent import IdempotencyKey, run_idempotent_route
from reservo.core.http.openapi import raises
from reservo.core.http.pagination import DEFAULT_LIMIT, After, Limit, decode_cursor, page
from reservo.core.http.responses import json_bytes, json_response, model_from
from reservo.core.http.route_inputs import PathId, from_state
from reservo.core.kernel.errors import validation_error
from reservo.scheduler import domain
from reservo.scheduler.batch import JobBatch, JobRequest
from reservo.scheduler.domain import Job, Recurring
from reservo.scheduler.schemas import (
    BulkRetried,
    BulkRetryIn,
    CategoryOut,
    CategoryPaused,
    JobCreated,
    JobIn,
    JobOut,
    JobPage,
    JobRescheduleIn,
    RateLimitIn,
    RateLimitOut,
    RecurringIn,
    RecurringOut,
)
from reservo.scheduler.service import Scheduler

router = APIRouter(prefix="/api", tags=["jobs"])
# Payloads live in PostgreSQL; keep them small.
MAX_PAYLOAD_BYTES = 64 * 1024


_svc = from_state(Scheduler, "scheduler")
# Only services (and admin) manage jobs, checked before the request is parsed.
Service = Annotated[Principal, role_caller("service")]
JobId = Annotated[PathId, Path(alias="jobId")]


def render(job: Job) -> dict[str, Any]:
    return out(job).wire()


def out(job: Job) -> JobOut:
    return model_from(JobOut, job, job_id=job.id, status=domain.public_status(job.status))


def may_create(caller: Principal, scheduler: Scheduler, category: str) -> None:
    """Services create jobs of public categories (``http``); a module's own
    (internal) categories act on other people's data, so only an admin may
    create one through the API (core.module.JobKind)."""
    if category in scheduler.internal:
        caller.require()  # admin only
    else:
        caller.require("service")


def check_payload(payload: dict[str, Any]) -> None:
    """What the API refuses of any payload before its category's model sees it
    (Scheduler.check_payload): its size."""
    if len(orjson.dumps(payload)) > MAX_PAYLOAD_BYTES:
        raise validation_error(
            f"payload larger than {MAX_PAYLOAD_BYTES} bytes", at=("body", "payload")
        )


@router.post(
    "/jobs",
    status_code=201,
    response_model=JobCreated,
    operation_id="createJob",
    openapi_extra=raises("unknown_category", "destination_not_allowed", "unknown_dependency"),
)
async def create_job(
    body: JobIn, caller: Service, request: Request, idempotency_key: IdempotencyKey = None
) -> Response:
    """Creates a job (201). With `uniqueKey`, while a job of the category with
    that key has not finished, none is created: 200 with that job and
    `deduplicated: true` (also for posts racing each other). With `after`, the
    job is due once every job named is DONE (and its `runAt` has come); until
    then it is `SCHEDULED`. If one of them ends DEAD or CANCELLED, the job is
    CANCELLED with `lastError: "dependency_failed"`, and so are the jobs
    waiting on it. 422 `unknown_dependency` for an id that is no job."""
    return await create_job_flow(
        request.app.state, caller, body, idempotency_key, await request.body()
    )


async def create_job_flow(
    state: Any, caller: Principal, body: JobIn, idempotency_key: str | None, raw: bytes
) -> Response:
    """What POST /api/jobs does once the request is parsed: the request joins
    the process's next batch of enqueues (scheduler/batch.py), where its job
    and its key's stored response commit in one transaction with the batch's
    other enqueues; the request returns once its job went to Redis after that
    commit."""
    # Admin only for a module's internal categories (the route's rule is Service).
    may_create(caller, state.scheduler, body.category)
    if body.run_at is not None and body.delay_ms is not None:
        raise validation_error("give runAt or delayMs, not both", at=("body", "delayMs"))
    check_payload(body.payload)
    key = validate_key(idempotency_key, required=False)
    delay = timedelta(milliseconds=body.delay_ms) if body.delay_ms is not None else None
    batch: JobBatch = state.scheduler_jobs
    answer = await batch.submit(
        JobRequest(
            caller,
            key,
            request_hash(raw) if key is not None else b"",
            body.category,
            body.payload,
            body.urgency,
            body.run_at,
            delay,
            domain.Extras(body.unique_key, tuple(dict.fromkeys(body.after))),
        )
    )
    return json_bytes(answer.status, orjson.dumps(answer.body))


# Served on the fast path (core/http/hotroute.py).
HOT_ROUTES = (create_job,)


def created(job: Job, deduplicated: bool = False) -> dict[str, Any]:
    return JobCreated(
        job_id=job.id,
        status=domain.public_status(job.status),
        run_at=job.run_at,
        deduplicated=deduplicated,
    ).wire()


async def _one_job(act: Callable[[], Awaitable[Job]]) -> JSONResponse:
    """What the routes of one job answer: the job as ``act`` leaves it."""
    return json_response(200, render(await act()))


@router.get(
    "/jobs/{jobId}",
    response_model=JobOut,
    operation_id="getJob",
    openapi_extra=raises("job_not_found"),
)
async def get_job(job_id: JobId, caller: Service, request: Request) -> JSONResponse:
    """One job (a service): its status, when it runs, its attempts and last error."""
    return await _one_job(lambda: _svc(request).get(job_id))


@router.delete(
    "/jobs/{jobId}",
    response_model=JobOut,
    operation_id="cancelJob",
    openapi_extra=raises("job_not_found", "not_cancellable"),
)
async def cancel_job(job_id: JobId, caller: Service, request: Request) -> JSONResponse:
    """Cancels a job no worker has claimed (SCHEDULED, QUEUED, or FAILED waiting
    for its retry): it never runs. Cancelling twice answers the cancelled job
    both times. A RUNNING or finished job is 409 `not_cancellable`; a worker
    claims a job up to the fire-ahead (10 ms by default) before its `runAt`."""
    return await _one_job(lambda: _svc(request).cancel_job(job_id))


Status = Literal["SCHEDULED", "QUEUED", "RUNNING", "DONE", "FAILED", "DEAD", "CANCELLED"]
Category = Annotated[
    str | None, Query(min_length=1, max_length=64, pattern=r"^[a-z][a-z0-9._-]{0,63}$")
]


@router.get("/jobs", response_model=JobPage, operation_id="listJobs", openapi_extra=raises())
async def list_jobs(
    caller: Service,
    request: Request,
    status: Annotated[Status | None, Query(description="only jobs in this status")] = None,
    category: Category = None,
    limit: Limit = DEFAULT_LIMIT,
    after: After = None,
) -> JSONResponse:
    """Jobs newest first (by id), optionally of one status and/or one category;
    keyset pagination (`next` -> `after`)."""
    before = decode_cursor(after, int)[0] if after is not None else None
    jobs = await _svc(request).list_jobs(status, category, before, limit + 1)
    items, nxt = page(jobs, limit, lambda j: j.id)
    return json_response(200, JobPage(items=[out(j) for j in items], next=nxt).wire())


@router.post(
    "/jobs/{jobId}/retry",
    response_model=JobOut,
    operation_id="retryJob",
    openapi_extra=raises("job_not_found", "not_retryable"),
)
async def retry_job(job_id: JobId, caller: Service, request: Request) -> JSONResponse:
    """A DEAD or FAILED job runs again now (`SCHEDULED`), with a fresh budget of
    RESERVO_SCHEDULER_MAX_ATTEMPTS attempts; earlier attempts stay counted.
    Any other status is 409 `not_retryable`."""
    return await _one_job(lambda: _svc(request).retry(job_id))


@router.patch(
    "/jobs/{jobId}",
    response_model=JobOut,
    operation_id="rescheduleJob",
    openapi_extra=raises("job_not_found", "not_cancellable"),
)
async def reschedule_job(
    job_id: JobId,
    body: JobRescheduleIn,
    caller: Service,
    request: Request,
) -> JSONResponse:
    """Moves a job no worker has claimed (SCHEDULED, QUEUED, or FAILED waiting
    for its retry) to `runAt`; it runs then and not at its old time. A RUNNING
    or finished job is 409 `not_cancellable`. A worker claims a job up to the
    fire-ahead (10 ms by default) before its `runAt` and starts it at `runAt`:
    from that claim the job is RUNNING."""
    return await _one_job(lambda: _svc(request).reschedule(job_id, body.run_at))


def render_recurring(r: Recurring) -> dict[str, Any]:
    return model_from(RecurringOut, r, next_run_at=r.next_at).wire()


@router.post(
    "/recurring-jobs",
    status_code=201,
    response_model=RecurringOut,
    operation_id="createRecurringJob",
    openapi_extra=raises("unknown_category", "destination_not_allowed"),
)
async def create_recurring_job(
    body: RecurringIn, caller: Service, request: Request, idempotency_key: IdempotencyKey = None
) -> JSONResponse:
    """One job per occurrence of `cron` in `timezone`, created ahead of time by
    the scheduler role. An occurrence in a skipped local hour (DST) runs once at
    the next valid instant; one in a repeated hour runs once (its first pass).
    A bad expression, an unknown zone or category is 422."""
    svc = _svc(request)
    may_create(caller, svc, body.category)
    check_payload(body.payload)
    key = validate_key(idempotency_key, required=False)

    def create(within: Within[Recurring] | None) -> Awaitable[Recurring]:
        return svc.create_recurring(
            body.category, body.cron, body.timezone, body.payload, body.urgency, within
        )

    return await run_idempotent_route(
        request, caller, "POST /api/recurring-jobs", key, create, render_recurring
    )


@router.delete(
    "/recurring-jobs/{recurringJobId}",
    status_code=204,
    response_class=Response,
    operation_id="deleteRecurringJob",
    openapi_extra=raises("recurring_job_not_found"),
)
async def delete_recurring_job(
    recurring_id: Annotated[PathId, Path(alias="recurringJobId")], caller: Service, request: Request
) -> Response:
    """No occurrence after this one is created; jobs already created for
    occurrences that have not run are cancelled (a running one finishes)."""
    await _svc(request).delete_recurring(recurring_id)
    return Response(status_code=204)


# -- categories: pause, rate limit, overview; bulk retry -----------------------------

CategoryName = Annotated[
    str, Path(alias="category", min_length=1, max_length=64, pattern=r"^[a-z][a-z0-9._-]{0,63}$")
]


def _paused(c: domain.Category) -> JSONResponse:
    return json_response(200, CategoryPaused(category=c.category, paused=c.paused).wire())


@router.post(
    "/job-categories/{category}/pause",
    response_model=CategoryPaused,
    operation_id="pauseJobCategory",
    openapi_extra=raises("category_not_found"),
)
async def pause_category(category: CategoryName, caller: AdminCaller, request: Request) -> Response:
    """The category's jobs stop starting in every worker process: due ones wait
    (none is lost, none runs, none is failed); jobs already running finish.
    A category a handler serves may be paused, also one no job has yet; any
    other is 404 `category_not_found` (GET /api/job-categories lists them)."""
    return _paused(await _svc(request).pause(category, True))


@router.post(
    "/job-categories/{category}/resume",
    response_model=CategoryPaused,
    operation_id="resumeJobCategory",
    openapi_extra=raises("category_not_found"),
)
async def resume_category(
    category: CategoryName, caller: AdminCaller, request: Request
) -> Response:
    """The jobs that waited run, in due order (within about a second). 404
    `category_not_found` for a category no handler serves."""
    return _paused(await _svc(request).pause(category, False))


@router.put(
    "/job-categories/{category}/rate-limit",
    response_model=RateLimitOut,
    operation_id="setJobCategoryRateLimit",
    openapi_extra=raises("category_not_found"),
)
async def set_rate_limit(
    category: CategoryName, body: RateLimitIn, caller: AdminCaller, request: Request
) -> Response:
    """At most `perSecond` jobs of the category start per second, across every
    worker process (`null` removes the limit). 422 below 0.001 or above 100,000;
    404 `category_not_found` for a category no handler serves."""
    c = await _svc(request).set_rate(category, body.per_second)
    return json_response(200, RateLimitOut(category=c.category, per_second=c.per_second).wire())


@router.get(
    "/job-categories",
    response_model=list[CategoryOut],
    operation_id="listJobCategories",
    openapi_extra=raises(),
)
async def list_categories(caller: Service, request: Request) -> Response:
    """Every category (with a handler, with jobs, or paused/limited): whether it
    is paused, its rate limit, and its jobs due now, running and dead."""
    return json_response(
        200, [model_from(CategoryOut, c).wire() for c in await _svc(request).overview()]
    )


@router.post(
    "/jobs/retry",
    response_model=BulkRetried,
    operation_id="retryDeadJobs",
    openapi_extra=raises(),
)
async def retry_dead_jobs(body: BulkRetryIn, caller: AdminCaller, request: Request) -> Response:
    """Every DEAD job (of `category` when given) runs again now, each with a
    fresh budget of attempts, as POST /api/jobs/{jobId}/retry does one. Two
    requests at once share the jobs: each is retried once, and the sum of
    their `retried` is the number of DEAD jobs."""
    retried = await _svc(request).retry_dead(body.category)
    return json_response(200, BulkRetried(retried=retried).wire())
