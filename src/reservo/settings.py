"""Settings read from the environment (prefix ``RESERVO_``)."""

from __future__ import annotations

import os
import re
from datetime import time
from pathlib import Path
from typing import Literal

from pydantic import Field, field_validator, model_validator
from pydantic_settings import BaseSettings, SettingsConfigDict

from reservo.core.auth import ROLES
from reservo.core.egress import parse_allow

# What a deployment must set, by setting name, with what each one protects.
SECRETS = {
    "jwt_secret": "bearer tokens and the console's cookies",
    "payments_webhook_secret": "payment confirmations and sandbox payment links",
    "results_webhook_secret": "match results",
}
MIN_SECRET_BYTES = 32
# Values this project once shipped as defaults (and so are public): refused
# whatever their length.
PUBLIC_SECRETS = frozenset(
    {"dev-secret-change-me-in-production-please", "dev-payments-secret", "dev-results-secret"}
)


class SettingsError(ValueError):
    """A setting that stops the start; its text is one line naming the variable."""


class Settings(BaseSettings):
    model_config = SettingsConfigDict(env_prefix="RESERVO_", extra="ignore")

    # Connections. None means "start the embedded one" (``reservo up`` only).
    database_url: str | None = None
    redis_url: str | None = None
    # True: RESERVO_REDIS_URL names any node of a Redis Cluster (the client finds
    # the others). False: one Redis (or a proxy in front of many).
    redis_cluster: bool = False
    data_dir: Path = Path(".reservo")
    http_host: str = "127.0.0.1"
    http_port: int = 8000
    # Slow clients (core/slow_clients.py). A request's headers must arrive within
    # http_header_timeout_s of its first byte, and its body within
    # http_body_timeout_s of the headers (408, then the connection is closed), so a
    # socket that sends half a request holds a descriptor that long at most.
    http_header_timeout_s: float = Field(default=15.0, gt=0, le=300)
    http_body_timeout_s: float = Field(default=15.0, gt=0, le=3600)
    # A kept-alive connection with no request in flight is closed after this long.
    http_keepalive_timeout_s: int = Field(default=5, ge=1, le=300)
    # Open connections per API process; a new one beyond it is closed at once,
    # before anything is read, so a flood of sockets cannot exhaust descriptors.
    http_max_connections: int = Field(default=1024, ge=1, le=1_000_000)
    # Request line and headers of one request, at most (431 above it, then close):
    # httptools sets no bound, so a fast client could otherwise fill memory.
    http_max_header_bytes: int = Field(default=65_536, ge=1024, le=16_777_216)
    # Graceful stop (core/graceful.py). On SIGTERM an API process keeps serving for
    # http_drain_s while /readyz answers 503, so the load balancer stops sending it
    # requests before it stops accepting; 0 stops at once (SIGINT always does).
    http_drain_s: float = Field(default=5.0, ge=0, le=600)
    # Then requests in flight get this long to finish before they are cancelled
    # (keep drain + this under the orchestrator's kill deadline: 30 s in Kubernetes).
    http_shutdown_timeout_s: float = Field(default=20.0, gt=0, le=3600)
    # Readiness (core/health.py): each dependency's check gets this long (under a
    # Kubernetes probe's default 1 s timeout), and an answer is reused this long, so
    # a flood of probes costs the dependencies one check per period per process.
    ready_timeout_s: float = Field(default=0.8, gt=0, le=30)
    ready_cache_s: float = Field(default=1.0, ge=0, le=60)

    db_pool_min: int = 2
    db_pool_max: int = 20
    db_command_timeout_s: float = 10.0
    # How long a request waits for a pooled connection before answering 503.
    db_acquire_timeout_s: float = 5.0
    # After a request found no writable primary (PostgreSQL down, or a failover in
    # progress), the next requests answer 503 unavailable at once for this long
    # instead of each waiting on a connect: no pile-up while it lasts. 0: off.
    db_unavailable_hold_s: float = Field(default=0.5, ge=0, le=30)
    # Streaming replicas (hot standbys of database_url), comma-separated; one URL
    # may name several hosts with target_session_attrs=prefer-standby (whichever
    # standby answers, else the primary: docs/SCALING.md). Only the
    # reads that may be seconds stale use them (the slot lists, the car search, the
    # match lists); every decision stays on the primary. Empty: none.
    database_replica_urls: str = ""
    # A replica further behind the primary than this serves nothing (its reads go
    # to the primary): the slot list may then be this much plus
    # appointments_slots_cache_ttl_s stale.
    replica_max_lag_s: float = Field(default=2.0, gt=0, le=60)
    # How often each API process measures every replica's lag (and finds one back).
    replica_probe_interval_s: float = Field(default=0.5, gt=0)
    # How long a read waits on a replica (connect, pool, statement) before it is
    # re-asked to the primary.
    replica_timeout_s: float = Field(default=1.0, gt=0)
    db_replica_pool_min: int = Field(default=0, ge=0)
    db_replica_pool_max: int = Field(default=20, ge=1)
    redis_timeout_s: float = 0.25
    # After a Redis failure, skip Redis for this long (fail open) instead of
    # paying a timeout on every request.
    redis_backoff_s: float = 1.0
    # Prefix of every Redis key, so deployments (and test runs) can share a Redis.
    redis_namespace: str = "reservo"

    # Security. Every secret the service trusts has no default: `reservo api`,
    # `worker` and `up` refuse to start until each is set to at least
    # MIN_SECRET_BYTES (check_secrets). Only `reservo up --demo` generates
    # throwaway ones (demo.py). The console's cookie key and the sandbox link key
    # are derived from the JWT secret and the payments webhook secret (HMAC with a
    # label of their own), so they are exactly as strong as those two.
    jwt_secret: str = ""
    # Verified tokens remembered per API process (by their exact text, until their
    # exp) so a caller's next request skips the ~30 us decode; 0 turns it off.
    token_cache_size: int = Field(default=10_000, ge=0, le=1_000_000)
    # The longest a bearer token may be valid (401 above it), counted from its
    # iat, and from now whatever iat says: a leaked or carelessly minted token
    # must not open the API for months. `reservo token` stays within it.
    jwt_max_lifetime_s: int = Field(default=24 * 3600, ge=60, le=366 * 86400)
    # An identity provider (Keycloak, Auth0, Entra, Cognito, ...): its tokens
    # (RS256, ES256, EdDSA, ...) are verified against the keys it publishes at
    # this JWKS URL (core/jwks.py). None: reservo's own HS256 tokens only.
    jwt_jwks_url: str | None = None
    # Checked when set: the token's iss must equal it, its aud must contain one of
    # these (comma-separated). A provider serves many applications: without the
    # audience, a token issued for another of them would open this API.
    jwt_issuer: str | None = None
    jwt_audience: str | None = None
    # Where a provider's token holds the role (a string or a list: the first that
    # maps wins) and the user id: a claim name, or a dotted path into nested
    # claims ("realm_access.roles"). The user id must be reservo's (a positive
    # 64-bit integer): a provider's own subject (a UUID, an e-mail) is refused.
    jwt_role_claim: str = "role"
    jwt_sub_claim: str = "sub"
    # The provider's role names -> reservo's, e.g. {"clinic-admin": "admin"}.
    # When set, only the names it lists count; empty: the names are reservo's own.
    jwt_role_map: dict[str, str] = Field(default_factory=dict)
    # With a JWKS URL, reservo's own HS256 tokens (RESERVO_JWT_SECRET, `reservo
    # token`) are refused unless this is true: one trust root, the provider's.
    jwt_accept_hs256: bool = False
    # The key set is fetched at start and every this often (a provider rotates
    # its keys well ahead of using a new one) ...
    jwt_jwks_refresh_s: float = Field(default=300.0, ge=10, le=86_400)
    # ... and on a token naming a kid it does not hold, at most once per this
    # long (per API process): a flood of made-up kids is not a flood of fetches.
    # A failed fetch keeps the last good set, and is tried again this often.
    jwt_jwks_min_interval_s: float = Field(default=10.0, ge=0.1, le=3600)
    jwt_jwks_timeout_s: float = Field(default=5.0, gt=0, le=60)
    # Hand the hottest routes' requests straight to their handler, in front of
    # the middleware stack (core/hotroute.py); same handler, same answers. False
    # sends them through the stack like every other request.
    lean_paths: bool = True
    # The console (/console): an admin signs in with an admin JWT once and gets a
    # session cookie, valid this long at most (never past the token's exp).
    console_session_s: int = Field(default=8 * 3600, ge=60, le=7 * 86400)
    # Mark the session cookie Secure (sent over https only): on behind TLS.
    console_secure_cookie: bool = False
    payments_webhook_secret: str = ""
    results_webhook_secret: str = ""
    webhook_tolerance_s: int = 300
    # Largest request body accepted (413 above it, before the body is read).
    max_body_bytes: int = Field(default=1_048_576, ge=1)

    # Idempotency keys are kept at least this long, then pruned.
    idempotency_retention_hours: int = Field(default=24, ge=24)
    # An IN_PROGRESS key older than this belongs to a crashed request and may be retaken.
    idempotency_lease_s: int = 60

    # Outbox relay.
    outbox_batch_size: int = 100
    outbox_poll_interval_s: float = 0.2
    outbox_lease_s: int = 30
    outbox_backoff_base_s: float = 0.5
    # Transient failures are retried forever; the cap keeps work resuming within
    # about a minute of an outage's end.
    outbox_backoff_max_s: float = 60.0

    # Kafka (core/transport/kafka.py). Unset bootstrap = the in-process local transport.
    kafka_bootstrap: str | None = None
    # Tansu's in-memory store (`reservo up --kafka`) refuses InitProducerId: set False there.
    kafka_idempotence: bool = True
    kafka_partitions: int = 6
    kafka_replication_factor: int = 1
    # Per-topic partition counts, e.g. RESERVO_KAFKA_TOPIC_PARTITIONS='{"matches.result.v1": 24}'.
    kafka_topic_partitions: dict[str, int] = Field(default_factory=dict)
    kafka_source: str = "/reservo"
    kafka_linger_ms: int = 5
    kafka_request_timeout_ms: int = 30_000
    # With Kafka the relay claims bigger batches: one ack round trip per batch.
    kafka_relay_batch_size: int = 2000
    kafka_group_prefix: str = "reservo"
    # Immediate retries of a transiently failing record before its partition backs off
    # (it is retried after that too, for as long as it takes; a rejection is parked at once).
    kafka_consumer_quick_retries: int = 3
    kafka_consumer_backoff_base_s: float = 0.2
    kafka_consumer_backoff_max_s: float = 5.0
    kafka_consumer_max_records: int = 1000
    # Handlers one consumer process runs at once (different keys); below db_pool_max.
    kafka_consumer_concurrency: int = 16
    kafka_session_timeout_ms: int = 10_000
    # Parked records also go to `<topic>.dlt` (the dead_letter table always gets them).
    kafka_dead_letter_topic: bool = True

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
    # The whole send (SMTP conversation, or SMS request and answer) ends within
    # this: the timeout above is per network operation, and a provider that
    # trickles its replies would otherwise hold the sender for as long as it likes.
    notify_deadline_s: float = Field(default=30.0, gt=0)

    # Appointments.
    appointments_booking_rate_limit: int = 5
    appointments_booking_rate_window_s: int = 10
    # How long a slot list read from the primary stays in Redis while nothing
    # changes it: every booking, cancellation and schedule change drops it (after
    # its commit, and durably through the outbox), so this bounds staleness only
    # when both drops are lost. It also expires when the day's next slot opens.
    appointments_slots_cache_life_s: int = Field(default=60, ge=1, le=3600)
    # The Redis life of a slot list read from a replica (which may lag behind a
    # change whose drop already ran).
    appointments_slots_cache_ttl_s: int = 3
    # Per-API-process copy of a slot list in front of Redis (0 turns it off): how
    # long another process may keep showing a list after a booking changed it.
    # Never longer than the Redis entry it was read from.
    appointments_slots_local_ttl_s: float = Field(default=1.0, ge=0, le=60)
    appointments_full_mark_ttl_s: int = 30
    # The booking window: a slot opens at this local time (the doctor's zone) of
    # the day HORIZON_DAYS before its date; repeating schedules are kept generated
    # up to today + HORIZON_DAYS. Stored per slot when it is generated.
    appointments_horizon_days: int = Field(default=14, ge=1, le=366)
    appointments_opening_time: time = time(7, 0)
    # How often a worker's "appointments" role extends repeating schedules
    # (idempotent; any number of workers may run it).
    appointments_schedule_interval_s: float = Field(default=600.0, gt=0)
    # The no-show policy: a patient with NO_SHOW_LIMIT no-shows of slots that
    # started within 90 days cannot book (nor reschedule, nor join a waitlist) for
    # NO_SHOW_BLOCK_DAYS from the last of them; an admin may lift it. Applied
    # when a no-show is marked, so the booking statement only probes one row.
    appointments_no_show_limit: int = Field(default=3, ge=1, le=1000)
    appointments_no_show_block_days: int = Field(default=30, ge=1, le=3650)
    # Calendar feeds. The public base URL a feed link starts with (what calendar
    # applications reach, e.g. https://clinic.example); None = http_host:http_port.
    appointments_calendar_url_base: str | None = None
    # How long a rendered feed stays in Redis while nothing changes it: every
    # booking, cancellation and reschedule of its patient or doctor, and a new
    # link, drop it, so this bounds the PostgreSQL reads of a polled feed (one per
    # feed and this period) and how long a change Redis missed stays unseen.
    appointments_calendar_cache_life_s: int = Field(default=60, ge=1, le=3600)
    # Per-API-process copy of a feed in front of Redis (0 turns it off): how long
    # another process may keep serving a feed (or a replaced link) after a change.
    appointments_calendar_local_ttl_s: float = Field(default=1.0, ge=0, le=60)

    # Scheduler (delayed jobs): only jobs due within the window live in Redis.
    scheduler_window_s: float = Field(default=300.0, gt=0)
    # The loader runs well inside the window; a full resync of the window runs
    # after a Redis flush/restart and every resync period.
    scheduler_loader_period_s: float = Field(default=5.0, gt=0)
    scheduler_resync_period_s: float = Field(default=60.0, gt=0)
    # A POST /api/jobs batch's push to Redis not done after this long (the
    # process died between commit and push) is done by the loader.
    scheduler_push_grace_s: float = Field(default=5.0, ge=0)
    scheduler_loader_batch: int = Field(default=5000, ge=1)
    scheduler_mover_batch: int = Field(default=1000, ge=1, le=5000)
    # The mover sleeps at most this long: lateness is milliseconds.
    scheduler_mover_idle_s: float = Field(default=0.01, gt=0)
    scheduler_lock_ttl_ms: int = Field(default=5000, ge=100)
    scheduler_max_attempts: int = Field(default=5, ge=1)
    scheduler_backoff_base_s: float = Field(default=1.0, gt=0)
    scheduler_backoff_max_s: float = Field(default=600.0, gt=0)
    # Per worker process.
    scheduler_loaders: int = Field(default=1, ge=0)
    scheduler_movers: int = Field(default=1, ge=0)
    scheduler_reapers: int = Field(default=1, ge=0)
    scheduler_executors: int = Field(default=2, ge=0)
    # Jobs one executor takes and runs concurrently.
    scheduler_executor_concurrency: int = Field(default=200, ge=1)
    scheduler_executor_idle_s: float = Field(default=0.05, gt=0)
    scheduler_heartbeat_s: float = Field(default=2.0, gt=0)
    # A RUNNING job without a heartbeat for this long belongs to a dead worker.
    scheduler_reaper_timeout_s: float = Field(default=15.0, gt=0)
    scheduler_reaper_period_s: float = Field(default=2.0, gt=0)
    scheduler_redis_timeout_s: float = Field(default=5.0, gt=0)
    # Recurring jobs: materialiser tasks per scheduler process (each pass, every
    # loader period, creates the jobs of occurrences within the window), and how
    # far back an occurrence missed while the service was down is still created
    # (older ones are skipped, with a log line).
    scheduler_materialisers: int = Field(default=1, ge=0)
    scheduler_recurring_catchup_s: float = Field(default=3600.0, ge=0)
    # Paused categories and rate limits (table job_category): how long each
    # worker process trusts what it read (a pause holds at once anyway: the
    # claim reads the table; a new rate applies everywhere within this), and
    # how many seconds of its rate a category may start at once after idling
    # (its token bucket's size, one job at least): small, so the rate holds
    # over short windows too.
    scheduler_category_refresh_s: float = Field(default=1.0, gt=0, le=60)
    scheduler_rate_burst_s: float = Field(default=0.1, gt=0, le=60)
    # `http` jobs: the timeout is per network operation (connect, one read), so
    # a destination trickling a byte at a time never trips it; the deadline
    # bounds the whole call (name lookup to the answer's head). Past it the
    # attempt failed (retried with backoff like any failed call).
    scheduler_http_timeout_s: float = Field(default=10.0, gt=0)
    scheduler_http_deadline_s: float = Field(default=30.0, gt=0)
    # Bytes of a destination's answer read at most; the rest is never read (the
    # connection is closed): a huge or endless answer costs no memory.
    scheduler_http_max_response_bytes: int = Field(default=65_536, ge=0)
    # Calls in flight to one destination (address and port) per worker process;
    # the jobs beyond it are put back for a second (not an attempt), so slow
    # destinations cannot take every executor slot from the others.
    scheduler_http_per_destination: int = Field(default=8, ge=1)
    # Destinations `http` jobs may call although the default policy refuses them
    # (loopback, private, link-local/metadata, reserved ranges; core/egress.py):
    # comma-separated host names, addresses and CIDR networks, e.g.
    # "callbacks.internal,10.1.0.0/16". Empty: public addresses only.
    jobs_http_allow: str = ""

    # Rentals.
    rentals_turnaround_minutes: int = Field(default=120, ge=0, le=7 * 24 * 60)
    rentals_hold_ttl_seconds: int = Field(default=900, ge=1)
    rentals_deposit_rate: float = Field(default=0.3, ge=0, le=1)
    # Holds created per customer per sliding window (counted in PostgreSQL).
    rentals_hold_rate_limit: int = Field(default=3, ge=1)
    rentals_hold_rate_window_s: int = Field(default=900, ge=1)
    rentals_search_cache_ttl_s: int = Field(default=30, ge=1)
    # Per-process copy of a search answer in front of Redis (0: none), never kept
    # past the Redis entry it was read from.
    rentals_search_local_ttl_s: float = Field(default=1.0, ge=0, le=60)
    rentals_sweep_interval_s: float = 30.0
    # A CONFIRMED booking may be picked up (ON_TRIP) from this long before its
    # `from` on, never earlier: a trip started months ahead and then returned would
    # take a future booking off the car's calendar (409 pickup_too_early).
    rentals_pickup_lead_minutes: int = Field(default=60, ge=0, le=7 * 24 * 60)
    # Public base URL of this API for the sandbox page's links; None = http_host:http_port.
    rentals_payment_url_base: str | None = None
    # `sandbox` simulates payments (its page) and records refunds locally; `http`
    # calls rentals_gateway_url. Never a default: None serves no payment page and
    # refunds wait (retried) until a gateway is set. `reservo up --demo` picks sandbox.
    rentals_payment_gateway: Literal["sandbox", "http"] | None = None
    rentals_gateway_url: str | None = None
    rentals_gateway_token: str | None = None
    rentals_gateway_timeout_s: float = 5.0
    # A refund (its attempts included) ends within this: the timeout above is per
    # network operation, which a gateway trickling its answer never trips.
    rentals_gateway_deadline_s: float = Field(default=30.0, gt=0)
    # How much later a HOLD expires after its one extension (POST
    # /api/bookings/{id}/extend-hold): the customer asked for more time to pay.
    rentals_hold_extension_s: int = Field(default=900, ge=1, le=24 * 3600)

    # Wallet: stakes spread over this many house sub-accounts per currency.
    wallet_house_shards: int = Field(default=8, ge=1, le=256)
    # The CSV statement (GET /api/accounts/{id}/statement.csv) streams from a
    # server-side cursor inside one read-only transaction, which stays open while
    # the client reads. These bound what one download may hold: the transaction
    # is ended (and the response cut short) after wallet_statement_max_s; each
    # fetch of wallet_statement_prefetch rows is a statement under
    # wallet_statement_fetch_timeout_s; and at most wallet_statement_streams
    # downloads per process hold a pool connection at once (503 statement_busy).
    wallet_statement_max_s: float = Field(default=300.0, gt=0, le=3600)
    wallet_statement_prefetch: int = Field(default=1_000, ge=10, le=50_000)
    wallet_statement_fetch_timeout_s: float = Field(default=10.0, gt=0, le=600)
    wallet_statement_streams: int = Field(default=4, ge=1, le=256)

    # Betting: settlement chunk size (bets per transaction; 5,000 cost less CPU and
    # time than 10,000 in bench/settlement: smaller payout events spread over the
    # house shards), result webhook to Kafka.
    betting_settle_chunk: int = Field(default=5_000, ge=1, le=100_000)
    # Chunk loops per process sharing one match (SKIP LOCKED keeps them apart).
    betting_settle_parallel: int = Field(default=2, ge=1, le=16)
    betting_publish_attempts: int = Field(default=3, ge=1, le=10)
    betting_publish_backoff_s: float = 0.05
    betting_publish_timeout_s: float = 2.0
    betting_breaker_failures: int = 3
    betting_breaker_reset_s: float = 10.0
    betting_resend_interval_s: float = 0.5
    betting_resend_batch: int = 100
    # How long a resender keeps the fallback rows it claimed while it publishes them.
    betting_resend_lease_s: float = Field(default=60.0, gt=0)
    betting_sweep_interval_s: float = 5.0
    # The largest potential payout a bet may have, in minor units (default
    # 10,000,000.00): above it the bet is refused (422 at the stake).
    betting_max_payout: int = Field(default=1_000_000_000, ge=1, le=2**63 - 1)

    @field_validator("jwt_role_map")
    @classmethod
    def _reservo_roles(cls, value: dict[str, str]) -> dict[str, str]:
        wrong = sorted(role for role in value.values() if role not in ROLES)
        if wrong:
            raise ValueError(f"maps to unknown role(s) {', '.join(wrong)}; one of {sorted(ROLES)}")
        return value

    @field_validator("jwt_jwks_url", "jwt_issuer", "jwt_audience")
    @classmethod
    def _empty_is_unset(cls, value: str | None) -> str | None:
        return value.strip() or None if value is not None else None

    @field_validator("jwt_jwks_url")
    @classmethod
    def _http_url(cls, value: str | None) -> str | None:
        if value is not None and not value.startswith(("https://", "http://")):
            raise ValueError("must be an http(s) URL")
        return value

    @field_validator("jobs_http_allow")
    @classmethod
    def _allow_list(cls, value: str) -> str:
        parse_allow(value)  # a typo fails at start, not at the first job
        return value

    # Retention (core/retention.py): the `maintenance` role deletes rows nothing
    # needs any more every `retention_interval_s`, in batches of
    # `retention_batch_size` rows (each its own transaction) with a pause between
    # batches. Never pruned: PENDING and DEAD outbox rows, notifications not SENT,
    # jobs not finished, dead letters not replayed, fallback rows not RESENT, and
    # the business records (bookings, payments, ledger, bets, results).
    retention_enabled: bool = True
    retention_interval_s: float = Field(default=300.0, gt=0)
    retention_batch_size: int = Field(default=5000, ge=1, le=100_000)
    retention_pause_s: float = Field(default=0.05, ge=0)
    # DONE outbox events, from their publication. The outbox is partitioned by
    # day (UTC) of creation: a day is dropped whole once it ends more than this
    # long ago (its DONE rows are kept up to a day longer than this, never less).
    retention_outbox_hours: int = Field(default=72, ge=1)
    # Day partitions created ahead (the maintenance role, every retention
    # interval, even with pruning off); a row no day covers lands in the default
    # partition, so running out of days slows pruning down, never an insert.
    retention_partition_days_ahead: int = Field(default=7, ge=1, le=366)
    # A partition drop waits this long at most for its table lock (every writer
    # of the table queues behind a waiting drop); not granted: tried again later.
    retention_partition_lock_timeout_ms: int = Field(default=200, ge=10, le=60_000)
    # Inbox rows must outlive every redelivery of their event: an operator replay
    # of an outbox row still kept (retention_outbox_hours) or a consumer group
    # re-reading its topic (Kafka's default retention.ms is 7 days). 72 h + 7 days
    # = 10 days; raise it with the topics' retention. Must exceed the outbox's.
    retention_inbox_hours: int = Field(default=240, ge=1)
    # SENT notifications. The table is the notifications consumer's inbox, so it is
    # kept at least as long as the inbox.
    retention_notification_days: int = Field(default=30, ge=1)
    # DONE/CANCELLED jobs and their executions, from their finish.
    retention_job_days: int = Field(default=30, ge=1)
    # DEAD jobs, and dead letters from their replay, are kept longer: post-mortems.
    retention_dead_job_days: int = Field(default=90, ge=1)
    retention_dead_letter_days: int = Field(default=90, ge=1)
    # Result webhooks resent from the fallback table; rejected (malformed) webhooks.
    retention_webhook_fallback_hours: int = Field(default=168, ge=1)
    retention_webhook_rejected_days: int = Field(default=30, ge=1)

    log_level: str = "INFO"
    log_json: bool = True
    # One log line per HTTP request (method, route, status, duration, request id).
    # Off by default: at thousands of requests a second the lines cost more CPU
    # than the cheap requests themselves; the request id is on every line a
    # request logs anyway (core/tracing.py).
    access_log: bool = False

    @property
    def replica_urls(self) -> list[str]:
        # Split where a URL starts, not at every comma: one URL may name several
        # hosts (``postgresql://h1:5432,h2:5432/db?target_session_attrs=prefer-standby``).
        parts = re.split(r",\s*(?=postgres(?:ql)?://)", self.database_replica_urls)
        return [url.strip(" ,") for url in parts if url.strip(" ,")]

    @model_validator(mode="after")
    def _replicas_can_be_within_the_bound(self) -> Settings:
        # A replica in step with the primary shows up to a probe interval of lag.
        if self.replica_probe_interval_s * 2 > self.replica_max_lag_s:
            raise ValueError(
                "RESERVO_REPLICA_PROBE_INTERVAL_S must be at most half of "
                "RESERVO_REPLICA_MAX_LAG_S: a replica in step shows up to one interval of lag"
            )
        return self

    @model_validator(mode="after")
    def _retention_keeps_what_a_redelivery_needs(self) -> Settings:
        if self.retention_inbox_hours <= self.retention_outbox_hours:
            raise ValueError(
                "RESERVO_RETENTION_INBOX_HOURS must exceed RESERVO_RETENTION_OUTBOX_HOURS: "
                "an inbox row must outlive every redelivery of its event"
            )
        if self.retention_notification_days * 24 < self.retention_inbox_hours:
            raise ValueError(
                "RESERVO_RETENTION_NOTIFICATION_DAYS must cover RESERVO_RETENTION_INBOX_HOURS: "
                "the notification table is the notifications consumer's inbox"
            )
        if self.retention_dead_job_days < self.retention_job_days:
            raise ValueError(
                "RESERVO_RETENTION_DEAD_JOB_DAYS must be at least RESERVO_RETENTION_JOB_DAYS"
            )
        return self


def env_name(setting: str) -> str:
    return f"RESERVO_{setting.upper()}"


# Settings whose value is never printed (`reservo config`).
_MASKED = re.compile(r"secret|password|token$")


def _shown(name: str, value: object) -> str:
    if value in (None, ""):
        return ""
    if _MASKED.search(name):
        return "********"
    text = str(value)
    if isinstance(value, str) and "://" in text:
        # A DSN's password: postgresql://user:pw@host/db -> postgresql://user:***@host/db
        text = re.sub(r"(://[^:/@]+:)[^@]*@", r"\1***@", text)
    return text


def describe(settings: Settings) -> list[tuple[str, str, str]]:
    """(setting, value as shown, where it came from) for every setting."""
    given = {key.upper() for key in os.environ}
    return [
        (
            name,
            _shown(name, getattr(settings, name)),
            "environment" if env_name(name) in given else "default",
        )
        for name in sorted(Settings.model_fields)
    ]


def secret_problems(settings: Settings) -> list[str]:
    """One line per secret that is missing, short, public or shared with another
    (a payment provider holding the JWT secret could sign itself an admin token)."""
    problems: list[str] = []
    seen: dict[str, str] = {}
    for name in SECRETS:
        value: str = getattr(settings, name)
        var = env_name(name)
        size = len(value.encode())
        if not value:
            problems.append(f"{var} is not set (it protects {SECRETS[name]})")
        elif value in PUBLIC_SECRETS:
            problems.append(f"{var} is a published demo value; set a secret of your own")
        elif size < MIN_SECRET_BYTES:
            problems.append(f"{var} is {size} bytes; at least {MIN_SECRET_BYTES} are required")
        elif value in seen:
            problems.append(f"{var} must differ from {seen[value]}")
        else:
            seen[value] = var
    return problems


def check_secrets(settings: Settings) -> None:
    problems = secret_problems(settings)
    if problems:
        raise SettingsError(
            f"{problems[0]}: generate one with `openssl rand -base64 48` "
            "(docs/OPERATIONS.md, Security)"
        )
