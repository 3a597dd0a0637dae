"""HTTP routes of the Delayed jobs API: parse, authorize, call the service, render."""

from __future__ import annotations

from collections.abc import Awaitable
from datetime import timedelta
from typing import Annotated, Any

import orjson
from fastapi import APIRouter, Path, Request
from fastapi.responses import JSONResponse
from pydantic import ValidationError

from reservo.core.errors import validation_error
from reservo.core.http import (
    Caller,
    IdempotencyKey,
    idempotency_store,
    json_response,
    problem_responses,
    run_idempotent,
)
from reservo.core.idempotency import Within, validate_key
from reservo.scheduler.domain import Job
from reservo.scheduler.schemas import HttpPayload, JobCreated, JobIn, JobOut
from reservo.scheduler.service import Scheduler

router = APIRouter(prefix="/api", tags=["jobs"])
PathId = Annotated[int, Path(ge=1, le=2**63 - 1)]
# Payloads live in PostgreSQL; keep them small.
MAX_PAYLOAD_BYTES = 64 * 1024
PROBLEMS = problem_responses(401, 403, 404, 409, 422, 503)


def _svc(request: Request) -> Scheduler:
    svc: Scheduler = request.app.state.scheduler
    return svc


def render(job: Job) -> dict[str, Any]:
    return JobOut(
        job_id=job.id,
        category=job.category,
        urgency=job.urgency,
        status=job.status,
        run_at=job.run_at,
        attempts=job.attempts,
        started_at=job.started_at,
        finished_at=job.finished_at,
        last_error=job.last_error,
    ).wire()


@router.post("/jobs", status_code=201, response_model=JobCreated, responses=PROBLEMS)
async def create_job(
    body: JobIn, caller: Caller, request: Request, idempotency_key: IdempotencyKey = None
) -> JSONResponse:
    caller.require("service")
    if body.run_at is not None and body.delay_ms is not None:
        raise validation_error("give runAt or delayMs, not both")
    if len(orjson.dumps(body.payload)) > MAX_PAYLOAD_BYTES:
        raise validation_error(f"payload larger than {MAX_PAYLOAD_BYTES} bytes")
    if body.category == "http":
        try:
            HttpPayload.model_validate(body.payload)
        except ValidationError as exc:
            errors = [{"loc": [str(x) for x in e["loc"]], "msg": e["msg"]} for e in exc.errors()]
            raise validation_error("bad payload for category http", errors) from exc
    svc = _svc(request)
    store = idempotency_store(request)
    key = validate_key(idempotency_key, required=False)
    delay = timedelta(milliseconds=body.delay_ms) if body.delay_ms is not None else None

    def create(within: Within[Job] | None) -> Awaitable[Job]:
        return svc.create(
            body.category,
            body.payload,
            urgency=body.urgency,
            run_at=body.run_at,
            delay=delay,
            within=within,
        )

    raw = await request.body()
    return await run_idempotent(store, caller, "POST /api/jobs", key, raw, create, created)


def created(job: Job) -> dict[str, Any]:
    return JobCreated(job_id=job.id, status=job.status, run_at=job.run_at).wire()


@router.get("/jobs/{jobId}", response_model=JobOut, responses=PROBLEMS)
async def get_job(
    job_id: Annotated[PathId, Path(alias="jobId")], caller: Caller, request: Request
) -> JSONResponse:
    caller.require("service")
    return json_response(200, render(await _svc(request).get(job_id)))


@router.delete("/jobs/{jobId}", response_model=JobOut, responses=PROBLEMS)
async def cancel_job(
    job_id: Annotated[PathId, Path(alias="jobId")], caller: Caller, request: Request
) -> JSONResponse:
    caller.require("service")
    return json_response(200, render(await _svc(request).cancel_job(job_id)))
