"""Settings are grouped per module (``Settings().scheduler.window_s``), yet every
variable keeps its name: RESERVO_SCHEDULER_WINDOW_S is what operators set, what
docs/OPERATIONS.md names and what ``reservo config`` lists."""

from __future__ import annotations

import json
import re
from datetime import time
from pathlib import Path
from typing import Any

import pytest
from pydantic import ValidationError

from reservo.settings import GROUPS, Settings, describe, env_name

# Every setting by its flat name as the release before the grouping had them
# (one flat class): the names are the users' contract and must not change.
FLAT_NAMES = [
    "access_log",
    "access_log_sample",
    "access_log_slow_ms",
    "appointments_booking_rate_limit",
    "appointments_booking_rate_window_s",
    "appointments_calendar_cache_life_s",
    "appointments_calendar_local_ttl_s",
    "appointments_calendar_url_base",
    "appointments_full_mark_ttl_s",
    "appointments_hold_sweep_interval_s",
    "appointments_horizon_days",
    "appointments_no_show_block_days",
    "appointments_no_show_limit",
    "appointments_opening_time",
    "appointments_schedule_interval_s",
    "appointments_slots_cache_life_s",
    "appointments_slots_stale_s",
    "appointments_slots_change_feed_interval_s",
    "appointments_slots_cache_ttl_s",
    "appointments_slots_local_ttl_s",
    "appointments_slots_refresh_ahead_s",
    "betting_breaker_failures",
    "betting_breaker_reset_s",
    "betting_max_payout",
    "betting_publish_attempts",
    "betting_publish_backoff_s",
    "betting_publish_timeout_s",
    "betting_resend_batch",
    "betting_resend_interval_s",
    "betting_resend_lease_s",
    "betting_settle_batch_matches",
    "betting_settle_chunk",
    "betting_settle_parallel",
    "betting_sweep_interval_s",
    "clock_skew_alert_s",
    "clock_sync_interval_s",
    "console_secure_cookie",
    "console_session_s",
    "data_dir",
    "database_replica_urls",
    "database_url",
    "db_acquire_timeout_s",
    "db_command_timeout_s",
    "db_commit_probe_s",
    "db_host_timeout_s",
    "db_pool_max",
    "db_pool_min",
    "db_replica_pool_max",
    "db_replica_pool_min",
    "db_unavailable_hold_s",
    "http_body_timeout_s",
    "http_drain_s",
    "http_header_timeout_s",
    "http_host",
    "http_keepalive_timeout_s",
    "http_max_connections",
    "http_max_header_bytes",
    "http_port",
    "http_request_deadline_s",
    "http_shutdown_timeout_s",
    "idempotency_lease_s",
    "idempotency_retention_hours",
    "idempotency_wait_ms",
    "jobs_http_allow",
    "jwt_accept_hs256",
    "jwt_audience",
    "jwt_issuer",
    "jwt_jwks_min_interval_s",
    "jwt_jwks_refresh_s",
    "jwt_jwks_timeout_s",
    "jwt_jwks_url",
    "jwt_max_lifetime_s",
    "jwt_role_claim",
    "jwt_role_map",
    "jwt_secret",
    "jwt_sub_claim",
    "kafka_bootstrap",
    "kafka_consumer_backoff_base_s",
    "kafka_consumer_backoff_max_s",
    "kafka_consumer_concurrency",
    "kafka_consumer_max_records",
    "kafka_consumer_quick_retries",
    "kafka_dead_letter_topic",
    "kafka_legacy_topics",
    "kafka_group_prefix",
    "kafka_idempotence",
    "kafka_linger_ms",
    "kafka_partitions",
    "kafka_relay_batch_size",
    "kafka_replication_factor",
    "kafka_request_timeout_ms",
    "kafka_session_timeout_ms",
    "kafka_source",
    "kafka_topic_partitions",
    "lean_paths",
    "log_json",
    "log_level",
    "max_body_bytes",
    "notify_channel",
    "notify_deadline_s",
    "notify_email_template",
    "notify_http_token",
    "notify_http_url",
    "notify_retry_base_s",
    "notify_retry_max_s",
    "notify_smtp_host",
    "notify_smtp_password",
    "notify_smtp_port",
    "notify_smtp_sender",
    "notify_smtp_starttls",
    "notify_smtp_username",
    "notify_timeout_s",
    "outbox_backoff_base_s",
    "outbox_backoff_max_s",
    "outbox_batch_size",
    "outbox_lease_s",
    "outbox_poll_interval_s",
    "payments_webhook_secret",
    "push_ttl_s",
    "push_vapid_private_key",
    "push_vapid_subject",
    "ready_cache_s",
    "ready_timeout_s",
    "redis_backoff_s",
    "redis_cluster",
    "redis_namespace",
    "redis_timeout_s",
    "redis_url",
    "rentals_deposit_rate",
    "rentals_gateway_deadline_s",
    "rentals_gateway_timeout_s",
    "rentals_gateway_token",
    "rentals_gateway_url",
    "rentals_hold_extension_s",
    "rentals_hold_rate_limit",
    "rentals_hold_rate_window_s",
    "rentals_hold_ttl_seconds",
    "rentals_payment_gateway",
    "rentals_payment_url_base",
    "rentals_pickup_lead_minutes",
    "rentals_search_cache_ttl_s",
    "rentals_search_local_ttl_s",
    "rentals_sweep_interval_s",
    "rentals_turnaround_minutes",
    "replica_max_lag_s",
    "replica_probe_interval_s",
    "replica_timeout_s",
    "results_webhook_secret",
    "retention_batch_size",
    "retention_dead_job_days",
    "retention_dead_letter_days",
    "retention_enabled",
    "retention_inbox_hours",
    "retention_interval_s",
    "retention_job_days",
    "retention_notification_days",
    "retention_outbox_hours",
    "retention_partition_days_ahead",
    "retention_partition_lock_timeout_ms",
    "retention_pause_s",
    "retention_webhook_fallback_hours",
    "retention_webhook_rejected_days",
    "scheduler_backoff_base_s",
    "scheduler_backoff_max_s",
    "scheduler_category_refresh_s",
    "scheduler_executor_concurrency",
    "scheduler_executor_idle_s",
    "scheduler_executors",
    "scheduler_fire_ahead_s",
    "scheduler_heartbeat_s",
    "scheduler_http_deadline_s",
    "scheduler_http_max_response_bytes",
    "scheduler_http_per_destination",
    "scheduler_http_timeout_s",
    "scheduler_loader_batch",
    "scheduler_loader_period_s",
    "scheduler_loaders",
    "scheduler_lock_ttl_ms",
    "scheduler_materialisers",
    "scheduler_max_attempts",
    "scheduler_mover_batch",
    "scheduler_mover_idle_s",
    "scheduler_movers",
    "scheduler_push_grace_s",
    "scheduler_rate_burst_s",
    "scheduler_reaper_period_s",
    "scheduler_reaper_timeout_s",
    "scheduler_reapers",
    "scheduler_recurring_catchup_s",
    "scheduler_redis_timeout_s",
    "scheduler_resync_period_s",
    "scheduler_window_s",
    "token_cache_size",
    "verify_interval_s",
    "wallet_currencies",
    "wallet_house_shards",
    "wallet_statement_fetch_timeout_s",
    "wallet_statement_max_s",
    "wallet_statement_prefetch",
    "wallet_statement_streams",
    "webhook_tolerance_s",
    "webhooks_backoff_base_s",
    "webhooks_backoff_max_s",
    "webhooks_per_endpoint",
    "webhooks_retention_days",
    "webhooks_retry_hours",
    "webhooks_timeout_s",
]

OPERATIONS = Path(__file__).resolve().parents[2] / "docs" / "OPERATIONS.md"


def _documented() -> set[str]:
    return {m.lower() for m in re.findall(r"RESERVO_([A-Z0-9_]+)", OPERATIONS.read_text())}


def _candidates(name: str, default: Any) -> list[Any]:
    """Values other than the default, of the setting's type, to try in turn."""
    if isinstance(default, bool):
        return [not default]
    if isinstance(default, int):
        return [default + 1, default - 1]
    if isinstance(default, float):
        return [default / 2, default + 0.25]
    if isinstance(default, time):
        return [time(8, 30)]
    if isinstance(default, dict):
        return [{"clinic-admin": "admin"}, {"matches.result.v1": 24}]
    if isinstance(default, Path):
        return [Path("elsewhere")]
    # Strings and unset values: one of these fits each such setting.
    return ["sandbox", "smtp", "http://elsewhere.example", "10.0.0.0/8", 7, 7.5, "elsewhere", "XBT"]


def _different_valid_value(name: str) -> Any:
    default = Settings().flat()[name]
    for value in _candidates(name, default):
        try:
            settings = Settings(**{name: value})
        except ValidationError:
            continue
        if settings.flat()[name] != default:
            return value
    raise AssertionError(f"no test value for {name}")


def _env_text(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, dict):
        return json.dumps(value)
    if isinstance(value, time):
        return value.isoformat()
    return str(value)


def test_the_flat_names_are_the_ones_users_know() -> None:
    assert sorted(Settings().flat()) == sorted(FLAT_NAMES)
    assert [name for name, _, _ in describe(Settings())] == sorted(FLAT_NAMES)


def test_every_documented_variable_is_a_setting() -> None:
    assert _documented() <= set(FLAT_NAMES)


@pytest.mark.parametrize("name", sorted(set(FLAT_NAMES) | _documented()))
def test_each_variable_lands_in_its_setting(name: str, monkeypatch: pytest.MonkeyPatch) -> None:
    value = _different_valid_value(name)
    expected = Settings(**{name: value}).flat()[name]
    monkeypatch.setenv(env_name(name), _env_text(value))
    settings = Settings()
    assert settings.flat()[name] == expected
    group, _, field = name.partition("_")
    if group in GROUPS:
        # Nested where its module reads it, under the name without the prefix.
        assert getattr(getattr(settings, group), field) == expected
    else:
        assert getattr(settings, name) == expected
    shown = {setting: source for setting, _, source in describe(settings)}
    assert shown[name] == "environment"


def test_a_group_keeps_the_environment_when_code_sets_one_of_its_fields(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("RESERVO_SCHEDULER_LOADERS", "3")
    settings = Settings(scheduler_window_s=2.0)
    assert (settings.scheduler.window_s, settings.scheduler.loaders) == (2.0, 3)


def test_with_changes_settings_by_their_flat_names() -> None:
    base = Settings()
    changed = base.with_(scheduler_window_s=2.0, rentals_hold_rate_limit=9, db_pool_max=3)
    assert (changed.scheduler.window_s, changed.rentals.hold_rate_limit, changed.db_pool_max) == (
        2.0,
        9,
        3,
    )
    # The original is untouched (its groups are not shared with the copy's).
    assert base.scheduler.window_s == Settings().scheduler.window_s
    assert base.rentals.hold_rate_limit == Settings().rentals.hold_rate_limit


def test_an_unknown_name_is_an_error_not_a_no_op() -> None:
    with pytest.raises(TypeError, match="scheduler_windows_s"):
        Settings().with_(scheduler_windows_s=2.0)
    # model_copy would set a module's flat name on nothing: it refuses it.
    with pytest.raises(TypeError, match="use with_"):
        Settings().model_copy(update={"scheduler_window_s": 2.0})


@pytest.mark.parametrize(
    ("env", "refusal"),
    [
        ({"RESERVO_IDEMPOTENCY_WAIT_MS": "-1"}, "greater than or equal to 0"),
        ({"RESERVO_IDEMPOTENCY_WAIT_MS": "30001"}, "less than or equal to 30000"),
        (
            {"RESERVO_IDEMPOTENCY_WAIT_MS": "5000", "RESERVO_IDEMPOTENCY_LEASE_S": "5"},
            "RESERVO_IDEMPOTENCY_WAIT_MS must be below RESERVO_IDEMPOTENCY_LEASE_S",
        ),
    ],
)
def test_the_idempotency_wait_is_bounded_and_below_the_lease(
    env: dict[str, str], refusal: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    with pytest.raises(ValidationError, match=refusal):
        Settings()


def test_the_idempotency_wait_defaults_to_two_seconds_and_may_be_off(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    assert Settings().idempotency_wait_ms == 2000
    monkeypatch.setenv("RESERVO_IDEMPOTENCY_WAIT_MS", "0")
    assert Settings().idempotency_wait_ms == 0
