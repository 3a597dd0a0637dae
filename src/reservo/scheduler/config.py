"""Settings of the scheduler (scheduler/setup.py), read from the environment (prefix
``RESERVO_SCHEDULER_``); ``reservo.settings.Settings`` nests them as ``scheduler``, so
each variable keeps its name. This class is the module's configuration: its
services take it (or its fields) as it is."""

from __future__ import annotations

from pydantic import Field
from pydantic_settings import BaseSettings, SettingsConfigDict


class SchedulerSettings(BaseSettings):
    model_config = SettingsConfigDict(env_prefix="RESERVO_SCHEDULER_", extra="ignore")

    # Scheduler (delayed jobs): only jobs due within the window live in Redis.
    window_s: float = Field(default=300.0, gt=0)
    # The loader runs well inside the window; a full resync of the window runs
    # after a Redis flush/restart and every resync period.
    loader_period_s: float = Field(default=5.0, gt=0)
    resync_period_s: float = Field(default=60.0, gt=0)
    # A POST /api/jobs batch's push to Redis not done after this long (the
    # process died between commit and push) is done by the loader.
    push_grace_s: float = Field(default=5.0, ge=0)
    loader_batch: int = Field(default=5000, ge=1)
    mover_batch: int = Field(default=1000, ge=1, le=5000)
    # The mover sleeps at most this long: lateness is milliseconds.
    mover_idle_s: float = Field(default=0.01, gt=0)
    # Jobs are handed out and claimed up to this long before their run_at, and
    # their handlers started at run_at: the hand-off from Redis and the claim in
    # PostgreSQL (a few milliseconds at a rush) happen before the moment, not
    # after it. Such a job is RUNNING (no longer cancellable) that long early;
    # 0 hands a job out only once due.
    fire_ahead_s: float = Field(default=0.01, ge=0, le=1)
    lock_ttl_ms: int = Field(default=5000, ge=100)
    max_attempts: int = Field(default=5, ge=1)
    backoff_base_s: float = Field(default=1.0, gt=0)
    backoff_max_s: float = Field(default=600.0, gt=0)
    # Per worker process.
    loaders: int = Field(default=1, ge=0)
    movers: int = Field(default=1, ge=0)
    reapers: int = Field(default=1, ge=0)
    executors: int = Field(default=2, ge=0)
    # Jobs one executor takes and runs concurrently.
    executor_concurrency: int = Field(default=200, ge=1)
    executor_idle_s: float = Field(default=0.05, gt=0)
    heartbeat_s: float = Field(default=2.0, gt=0)
    # A RUNNING job without a heartbeat for this long belongs to a dead worker.
    reaper_timeout_s: float = Field(default=15.0, gt=0)
    reaper_period_s: float = Field(default=2.0, gt=0)
    redis_timeout_s: float = Field(default=5.0, gt=0)
    # Recurring jobs: materialiser tasks per scheduler process (each pass, every
    # loader period, creates the jobs of occurrences within the window), and how
    # far back an occurrence missed while the service was down is still created
    # (older ones are skipped, with a log line).
    materialisers: int = Field(default=1, ge=0)
    recurring_catchup_s: float = Field(default=3600.0, ge=0)
    # Paused categories and rate limits (table job_category): how long each
    # worker process trusts what it read (a pause holds at once anyway: the
    # claim reads the table; a new rate applies everywhere within this), and
    # how many seconds of its rate a category may start at once after idling
    # (its token bucket's size, one job at least): small, so the rate holds
    # over short windows too.
    category_refresh_s: float = Field(default=1.0, gt=0, le=60)
    rate_burst_s: float = Field(default=0.1, gt=0, le=60)
    # `http` jobs: the timeout is per network operation (connect, one read), so
    # a destination trickling a byte at a time never trips it; the deadline
    # bounds the whole call (name lookup to the answer's head). Past it the
    # attempt failed (retried with backoff like any failed call).
    http_timeout_s: float = Field(default=10.0, gt=0)
    http_deadline_s: float = Field(default=30.0, gt=0)
    # Bytes of a destination's answer read at most; the rest is never read (the
    # connection is closed): a huge or endless answer costs no memory.
    http_max_response_bytes: int = Field(default=65_536, ge=0)
    # Calls in flight to one destination (address and port) per worker process;
    # the jobs beyond it wait their turn while the destination answers, and are
    # put back for a second (not an attempt) once it is slow, so slow
    # destinations cannot take every executor slot from the others. 128 of the
    # 400 slots of a process (2 executors of 200): on a loaded process a call
    # to a quick destination takes 0.2-0.7 s, and the share caps one
    # destination's calls a second at share / that (bench/scheduler/http_burst.py:
    # p99 2.8-3.4 s at 128 against 5.9-8.1 s at 32, 20-37 s at 8; issue 39).
    http_per_destination: int = Field(default=128, ge=1)
