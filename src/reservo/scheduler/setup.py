"""Builds the Scheduler from Settings (called by the composition root)."""

from __future__ import annotations

from reservo.core.clock import Clock
from reservo.core.db import Database
from reservo.core.egress import parse_allow
from reservo.core.redis import make_client
from reservo.scheduler.handlers import HttpHandler
from reservo.scheduler.service import Config, Scheduler
from reservo.settings import Settings


def config_from(settings: Settings) -> Config:
    return Config(
        window_s=settings.scheduler_window_s,
        loader_period_s=settings.scheduler_loader_period_s,
        resync_period_s=settings.scheduler_resync_period_s,
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
    )


def build_scheduler(settings: Settings, db: Database, clock: Clock) -> Scheduler:
    assert settings.redis_url
    # Its own client: blocking pops and large pipelines need a longer timeout
    # than the fail-fast request-path client.
    client = make_client(settings.redis_url, settings.scheduler_redis_timeout_s)
    scheduler = Scheduler(db, clock, client, settings.redis_namespace, config_from(settings))
    http = HttpHandler(settings.scheduler_http_timeout_s, parse_allow(settings.jobs_http_allow))
    scheduler.register("http", http, http.check)
    scheduler.on_close(http.aclose)
    return scheduler
