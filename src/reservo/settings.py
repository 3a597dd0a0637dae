"""Settings read from the environment (prefix ``RESERVO_``)."""

from __future__ import annotations

from pathlib import Path
from typing import Literal

from pydantic import Field
from pydantic_settings import BaseSettings, SettingsConfigDict


class Settings(BaseSettings):
    model_config = SettingsConfigDict(env_prefix="RESERVO_", extra="ignore")

    # Connections. None means "start the embedded one" (``reservo up`` only).
    database_url: str | None = None
    redis_url: str | None = None
    data_dir: Path = Path(".reservo")
    http_host: str = "127.0.0.1"
    http_port: int = 8000

    db_pool_min: int = 2
    db_pool_max: int = 20
    db_command_timeout_s: float = 10.0
    # How long a request waits for a pooled connection before answering 503.
    db_acquire_timeout_s: float = 5.0
    redis_timeout_s: float = 0.25
    # After a Redis failure, skip Redis for this long (fail open) instead of
    # paying a timeout on every request.
    redis_backoff_s: float = 1.0
    # Prefix of every Redis key, so deployments (and test runs) can share a Redis.
    redis_namespace: str = "reservo"

    # Security. The default secrets are for local demos only; `reservo up`
    # prints a warning when they are in use.
    jwt_secret: str = "dev-secret-change-me-in-production-please"
    payments_webhook_secret: str = "dev-payments-secret"
    results_webhook_secret: str = "dev-results-secret"
    webhook_tolerance_s: int = 300

    # Idempotency keys are kept at least this long, then pruned.
    idempotency_retention_hours: int = Field(default=24, ge=24)
    # An IN_PROGRESS key older than this belongs to a crashed request and may be retaken.
    idempotency_lease_s: int = 60

    # Outbox relay.
    outbox_batch_size: int = 100
    outbox_poll_interval_s: float = 0.2
    outbox_lease_s: int = 30
    outbox_max_attempts: int = 8
    outbox_backoff_base_s: float = 0.5
    outbox_backoff_max_s: float = 300.0

    # Notifications.
    notify_channel: Literal["log", "smtp", "http"] = "log"
    notify_smtp_host: str = "127.0.0.1"
    notify_smtp_port: int = 25
    notify_smtp_sender: str = "reservo@localhost"
    notify_smtp_username: str | None = None
    notify_smtp_password: str | None = None
    notify_smtp_starttls: bool = False
    # Recipients are users ids; SMTP needs an address.
    notify_email_template: str = "user-{user_id}@example.invalid"
    notify_http_url: str | None = None
    notify_http_token: str | None = None
    notify_timeout_s: float = 5.0

    # Appointments.
    appointments_booking_rate_limit: int = 5
    appointments_booking_rate_window_s: int = 10
    appointments_slots_cache_ttl_s: int = 3
    appointments_full_mark_ttl_s: int = 30
    appointments_max_schedule_days: int = 92

    log_level: str = "INFO"
    log_json: bool = True
