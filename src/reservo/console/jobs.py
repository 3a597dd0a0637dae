"""The jobs page: counts per status, Redis's queues per category and urgency,
the categories (pause/resume, rate limit, bulk retry of their DEAD jobs), the
job list (filtered by status and category, newest first, keyset pages), a
job's executions with its retry and cancel buttons, and the recurring jobs.
Every read and action is the scheduler's use case (``request.app.state.scheduler``)
that the Delayed jobs API calls; only the capped status counts are the
console's own read (``Figures.job_statuses``)."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Annotated, Any

from fastapi import APIRouter, Form, Path, Query, Request
from fastapi.responses import HTMLResponse, RedirectResponse, Response

from reservo.console.figures import Figures
from reservo.console.web import SignedIn, Verified, render, render_refused
from reservo.core.kernel.errors import DomainError
from reservo.scheduler import CANCELLABLE, RETRYABLE, STATUSES, Job, Scheduler, valid_category

router = APIRouter(prefix="/console", include_in_schema=False)
REFRESH_S = 5
PAGE = 50
RECURRING_SHOWN = 50
JobId = Annotated[int, Path(ge=1, le=2**63 - 1)]
Before = Annotated[int | None, Query(ge=1, le=2**63 - 1)]
CategoryName = Annotated[
    str, Path(min_length=1, max_length=64, pattern=r"^[a-z][a-z0-9._-]{0,63}$")
]


def _scheduler(request: Request) -> Scheduler:
    s: Scheduler = request.app.state.scheduler
    return s


def _figures(request: Request) -> Figures:
    f: Figures = request.app.state.console_figures
    return f


async def _counts(request: Request) -> dict[str, Any]:
    return {
        "statuses": await _figures(request).job_statuses(STATUSES),
        "queues": await _scheduler(request).queue_lengths(),
        "refresh_s": REFRESH_S,
    }


async def _jobs_page(
    request: Request,
    session: SignedIn,
    status: str = "",
    category: str = "",
    before: int | None = None,
    error: str | None = None,
    code: int = 200,
    retried: int | None = None,
) -> HTMLResponse:
    problems = [error] if error else []
    if status and status not in STATUSES:
        problems.append(f"No status {status!r}: choose one of {', '.join(STATUSES)}.")
    if category and not valid_category(category):
        problems.append(f"{category!r} is not a category name (a-z, 0-9, '.', '_', '-').")
    svc = _scheduler(request)
    listed = []
    if not problems or error:
        listed = await svc.list_jobs(status or None, category or None, before, PAGE + 1)
    shown = listed[:PAGE]
    return render(
        request,
        "jobs.html",
        session,
        status=code if error else 422 if problems else 200,
        error=" ".join(problems) or None,
        jobs=shown,
        more=shown[-1].id if len(listed) > PAGE else None,
        chosen_status=status,
        chosen_category=category,
        all_statuses=STATUSES,
        recurring=await svc.list_recurring(None, RECURRING_SHOWN),
        categories=await svc.overview(),
        retried=retried,
        **await _counts(request),
    )


@router.get("/jobs", response_class=HTMLResponse)
async def jobs(
    request: Request,
    session: SignedIn,
    status: Annotated[str, Query(max_length=20)] = "",
    category: Annotated[str, Query(max_length=64)] = "",
    before: Before = None,
    retried: Annotated[int | None, Query(ge=0, le=2**63 - 1)] = None,
) -> HTMLResponse:
    return await _jobs_page(request, session, status, category, before, retried=retried)


@router.get("/jobs/counts", response_class=HTMLResponse)
async def job_counts(request: Request, session: SignedIn) -> HTMLResponse:
    return render(request, "jobs_counts.html", session, **await _counts(request))


async def _job_page(
    request: Request, session: SignedIn, job_id: int, error: str | None = None, status: int = 200
) -> HTMLResponse:
    svc = _scheduler(request)
    try:
        job = await svc.get(job_id)
    except DomainError as err:
        return render_refused(request, "job.html", session, err, job=None)
    unique_key, related = await svc.dependencies(job_id)
    return render(
        request,
        "job.html",
        session,
        status=status,
        error=error,
        job=job,
        runs=await svc.executions(job_id),
        unique_key=unique_key,
        related=related,
        retryable=job.status in RETRYABLE,
        cancellable=job.status in CANCELLABLE,
    )


@router.get("/jobs/{job_id}", response_class=HTMLResponse)
async def job(request: Request, session: SignedIn, job_id: JobId) -> HTMLResponse:
    return await _job_page(request, session, job_id)


async def _act(
    request: Request, session: Verified, job_id: int, use_case: Callable[[int], Awaitable[Job]]
) -> Response:
    """Runs the scheduler's use case; a refusal is shown on the job's page."""
    try:
        await use_case(job_id)
    except DomainError as err:
        return await _job_page(request, session, job_id, err.detail, err.status)
    return RedirectResponse(f"/console/jobs/{job_id}", status_code=303)


@router.post("/jobs/{job_id}/retry", response_model=None)
async def retry(request: Request, session: Verified, job_id: JobId) -> Response:
    """POST /api/jobs/{id}/retry's use case: a DEAD or FAILED job runs again now."""
    return await _act(request, session, job_id, _scheduler(request).retry)


@router.post("/jobs/{job_id}/cancel", response_model=None)
async def cancel(request: Request, session: Verified, job_id: JobId) -> Response:
    """DELETE /api/jobs/{id}'s use case: a job no worker has claimed is cancelled."""
    return await _act(request, session, job_id, _scheduler(request).cancel_job)


@router.post("/recurring-jobs/{recurring_id}/delete", response_model=None)
async def delete_recurring(request: Request, session: Verified, recurring_id: JobId) -> Response:
    """DELETE /api/recurring-jobs/{id}'s use case."""
    try:
        await _scheduler(request).delete_recurring(recurring_id)
    except DomainError as err:
        return await _jobs_page(request, session, error=err.detail, code=err.status)
    return RedirectResponse("/console/jobs", status_code=303)


# -- categories: pause/resume, rate limit, bulk retry of DEAD jobs -----------------------


async def _category_act(
    request: Request, session: Verified, act: Callable[[], Awaitable[object]]
) -> Response:
    """Runs a category use case of the scheduler; a refusal is shown on the jobs page."""
    try:
        await act()
    except DomainError as err:
        return await _jobs_page(request, session, error=err.detail, code=err.status)
    return RedirectResponse("/console/jobs#categories-h", status_code=303)


@router.post("/job-categories/{category}/pause", response_model=None)
async def pause(request: Request, session: Verified, category: CategoryName) -> Response:
    """POST /api/job-categories/{category}/pause's use case."""
    return await _category_act(request, session, lambda: _scheduler(request).pause(category, True))


@router.post("/job-categories/{category}/resume", response_model=None)
async def resume(request: Request, session: Verified, category: CategoryName) -> Response:
    """POST /api/job-categories/{category}/resume's use case."""
    return await _category_act(request, session, lambda: _scheduler(request).pause(category, False))


@router.post("/job-categories/{category}/rate-limit", response_model=None)
async def rate_limit(
    request: Request,
    session: Verified,
    category: CategoryName,
    per_second: Annotated[str, Form(max_length=40)] = "",
) -> Response:
    """PUT /api/job-categories/{category}/rate-limit's use case; an empty
    field removes the limit."""
    raw = per_second.strip()
    try:
        # NaN and infinity too are refused by the use case's range check.
        rate = float(raw) if raw else None
    except ValueError:
        return await _jobs_page(
            request, session, error=f"{raw!r} is not a number of jobs per second.", code=422
        )
    svc = _scheduler(request)
    return await _category_act(request, session, lambda: svc.set_rate(category, rate))


@router.post("/jobs/retry-dead", response_model=None)
async def retry_dead(
    request: Request,
    session: Verified,
    category: Annotated[str, Form(max_length=64)] = "",
) -> Response:
    """POST /api/jobs/retry's use case: every DEAD job (of one category, when
    given) runs again now, each once even when two operators press it."""
    try:
        n = await _scheduler(request).retry_dead(category or None)
    except DomainError as err:
        return await _jobs_page(request, session, error=err.detail, code=err.status)
    return RedirectResponse(f"/console/jobs?retried={n}#categories-h", status_code=303)
