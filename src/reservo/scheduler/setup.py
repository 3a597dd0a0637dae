"""Builds the scheduler from settings: the job queue every module may enqueue
into (``build_scheduler``: the composition root makes it the shared
``core.jobqueue.JobQueue``), and the scheduler module's face (``setup``: the
jobs API, the ``scheduler`` role, the http job kind, its retention)."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import timedelta

from reservo.core import outbound
from reservo.core.clock import Clock
from reservo.core.db import Database
from reservo.core.egress import parse_allow
from reservo.core.module import JobKind, Module
from reservo.core.redis import make_client
from reservo.core.retention import PruneRule
from reservo.scheduler.api import HOT_ROUTES, created, router
from reservo.scheduler.batch import JobBatch
from reservo.scheduler.errors import CONSTRAINTS, ERRORS
from reservo.scheduler.handlers import HttpHandler
from reservo.scheduler.repo import Q
from reservo.scheduler.schemas import HttpPayload
from reservo.scheduler.service import Config, Scheduler
from reservo.scheduler.workers import run
from reservo.settings import Settings
from reservo.shared import Shared


def config_from(settings: Settings) -> Config:
    return Config(
        window_s=settings.scheduler_window_s,
        loader_period_s=settings.scheduler_loader_period_s,
        resync_period_s=settings.scheduler_resync_period_s,
        push_grace_s=settings.scheduler_push_grace_s,
        loader_batch=settings.scheduler_loader_batch,
        mover_batch=settings.scheduler_mover_batch,
        mover_idle_s=settings.scheduler_mover_idle_s,
        lock_ttl_ms=settings.scheduler_lock_ttl_ms,
        max_attempts=settings.scheduler_max_attempts,
        backoff_base_s=settings.scheduler_backoff_base_s,
        backoff_max_s=settings.scheduler_backoff_max_s,
        loaders=settings.scheduler_loaders,
        movers=settings.scheduler_movers,
        reapers=settings.scheduler_reapers,
        executors=settings.scheduler_executors,
        executor_batch=settings.scheduler_executor_concurrency,
        executor_idle_s=settings.scheduler_executor_idle_s,
        heartbeat_s=settings.scheduler_heartbeat_s,
        reaper_timeout_s=settings.scheduler_reaper_timeout_s,
        reaper_period_s=settings.scheduler_reaper_period_s,
        materialisers=settings.scheduler_materialisers,
        recurring_catchup_s=settings.scheduler_recurring_catchup_s,
        category_refresh_s=settings.scheduler_category_refresh_s,
        rate_burst_s=settings.scheduler_rate_burst_s,
    )


def build_scheduler(settings: Settings, db: Database, clock: Clock) -> Scheduler:
    assert settings.redis_url
    # Its own client: blocking pops and large pipelines need a longer timeout
    # than the fail-fast request-path client.
    client = make_client(
        settings.redis_url, settings.scheduler_redis_timeout_s, cluster=settings.redis_cluster
    )
    return Scheduler(db, clock, client, settings.redis_namespace, config_from(settings))


@dataclass(frozen=True, kw_only=True)
class SchedulerModule(Module):
    service: Scheduler
    jobs_batch: JobBatch


def setup(shared: Shared) -> SchedulerModule:
    s, scheduler = shared.settings, shared.scheduler
    if not isinstance(scheduler, Scheduler):
        # The module runs the jobs of the queue the root built with build_scheduler.
        raise TypeError("the scheduler module needs the job queue build_scheduler makes")
    http = HttpHandler(
        s.scheduler_http_timeout_s,
        parse_allow(s.jobs_http_allow),
        outbound.Limits(s.scheduler_http_deadline_s, s.scheduler_http_max_response_bytes),
        s.scheduler_http_per_destination,
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
