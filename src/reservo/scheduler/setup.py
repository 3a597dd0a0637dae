"""Builds the scheduler from settings: the job queue every module may enqueue
into (``build_scheduler``: the composition root makes it the shared
``core.jobqueue.JobQueue``), and the scheduler module's face (``setup``: the
jobs API, the ``scheduler`` role, the http job kind, its retention)."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import timedelta

from reservo.core.db.database import Database
from reservo.core.http import outbound
from reservo.core.kernel.clock import Clock
from reservo.core.maintenance.retention import PruneRule
from reservo.core.module import JobKind, Module
from reservo.core.redis.client import make_client
from reservo.scheduler.api import HOT_ROUTES, created, router
from reservo.scheduler.batch import JobBatch
from reservo.scheduler.egress import parse_allow
from reservo.scheduler.errors import CONSTRAINTS, ERRORS
from reservo.scheduler.handlers import HttpHandler
from reservo.scheduler.repo import Q
from reservo.scheduler.schemas import HttpPayload
from reservo.scheduler.service import Scheduler
from reservo.scheduler.workers import run
from reservo.settings import Settings
from reservo.shared import Shared


def build_scheduler(settings: Settings, db: Database, clock: Clock) -> Scheduler:
    assert settings.redis_url
    # Its own client: blocking pops and large pipelines need a longer timeout
    # than the fail-fast request-path client.
    client = make_client(
        settings.redis_url, settings.scheduler.redis_timeout_s, cluster=settings.redis_cluster
    )
    return Scheduler(db, clock, client, settings.redis_namespace, settings.scheduler)


@dataclass(frozen=True, kw_only=True)
class SchedulerModule(Module):
    service: Scheduler
    jobs_batch: JobBatch


def setup(shared: Shared) -> SchedulerModule:
    s, scheduler = shared.settings, shared.scheduler
    if not isinstance(scheduler, Scheduler):
        # The module runs the jobs of the queue the root built with build_scheduler.
        raise TypeError("the scheduler module needs the job queue build_scheduler makes")
    own = s.scheduler
    http = HttpHandler(
        own.http_timeout_s,
        parse_allow(s.jobs_http_allow),
        outbound.Limits(own.http_deadline_s, own.http_max_response_bytes),
        own.http_per_destination,
    )
    batch = JobBatch(scheduler, shared.idempotency, created)
    return SchedulerModule(
        name="scheduler",
        service=scheduler,
        jobs_batch=batch,
        routers=[router],
        hot=HOT_ROUTES,
        jobs=[JobKind("http", http, http.check, payload=HttpPayload, public=True)],
        roles={"scheduler": lambda stop: run(scheduler, stop)},
        errors=ERRORS,
        constraints=CONSTRAINTS,
        state={"scheduler": scheduler, "scheduler_jobs": batch},
        closers=[batch.close, http.aclose],
        retention=retention(s),
    )


def retention(s: Settings) -> list[PruneRule]:
    """Finished jobs (with their executions) from their finish; DEAD ones are
    kept longer, for post-mortems."""
    return [
        PruneRule(
            "job_prune_finished",
            "scheduled_job",
            Q.job_prune_finished,
            timedelta(days=s.retention_job_days),
        ),
        PruneRule(
            "job_prune_dead",
            "scheduled_job",
            Q.job_prune_dead,
            timedelta(days=s.retention_dead_job_days),
        ),
    ]
