"""Settings read from the environment (prefix ``RESERVO_``)."""

from __future__ import annotations

import os
import re
from collections.abc import Mapping
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from pydantic import BaseModel, Field, field_validator, model_validator
from pydantic_settings import BaseSettings, SettingsConfigDict

from reservo.appointments.config import AppointmentsSettings
from reservo.betting.config import BettingSettings
from reservo.core.http.auth import ROLES
from reservo.rentals.config import RentalsSettings
from reservo.scheduler.config import SchedulerSettings
from reservo.scheduler.egress import parse_allow
from reservo.wallet.config import WalletSettings
from reservo.webhooks.config import WebhooksSettings

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


NOTIFY_CHANNELS = ("log", "smtp", "http")


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
    # Slow clients (core/http/slow_clients.py). A request's headers must arrive within
    # http_header_timeout_s of its first byte, and its body within
    # http_body_timeout_s of the headers (408, then the connection is closed), so a
    # socket that sends half a request holds a descriptor that long at most.
    http_header_timeout_s: float = Field(default=15.0, gt=0, le=300)
    http_body_timeout_s: float = Field(default=15.0, gt=0, le=3600)
    # A request whose response has not begun this long after it arrived (not
    # counting the wait for its body) is answered 503 unavailable and its handler
    # cancelled (core/http/deadline.py): over a slow network every statement stays
    # within its timeout while the request as a whole does not. 0: no deadline.
    http_request_deadline_s: float = Field(default=15.0, ge=0, le=3600)
    # A kept-alive connection with no request in flight is closed after this long.
    http_keepalive_timeout_s: int = Field(default=5, ge=1, le=300)
    # Open connections per API process; a new one beyond it is closed at once,
    # before anything is read, so a flood of sockets cannot exhaust descriptors.
    http_max_connections: int = Field(default=1024, ge=1, le=1_000_000)
    # Request line and headers of one request, at most (431 above it, then close):
    # httptools sets no bound, so a fast client could otherwise fill memory.
    http_max_header_bytes: int = Field(default=65_536, ge=1024, le=16_777_216)
    # Graceful stop (core/http/graceful.py). On SIGTERM an API process keeps serving for
    # http_drain_s while /readyz answers 503, so the load balancer stops sending it
    # requests before it stops accepting; 0 stops at once (SIGINT always does).
    http_drain_s: float = Field(default=5.0, ge=0, le=600)
    # Then requests in flight get this long to finish before they are cancelled
    # (keep drain + this under the orchestrator's kill deadline: 30 s in Kubernetes).
    http_shutdown_timeout_s: float = Field(default=20.0, gt=0, le=3600)
    # Readiness (core/http/health.py): each dependency's check gets this long (under a
    # Kubernetes probe's default 1 s timeout), and an answer is reused this long, so
    # a flood of probes costs the dependencies one check per period per process.
    ready_timeout_s: float = Field(default=0.8, gt=0, le=30)
    ready_cache_s: float = Field(default=1.0, ge=0, le=60)

    db_pool_min: int = 2
    db_pool_max: int = 20
    db_command_timeout_s: float = 10.0
    # How long a request waits for a pooled connection before answering 503.
    db_acquire_timeout_s: float = 5.0
    # How long a connect waits for each host of a multi-host database_url before
    # trying the next: a host cut off by a partition drops packets and never
    # refuses (core/db/hosts.py). The host that answered last is tried first.
    db_host_timeout_s: float = Field(default=2.0, gt=0, le=60)
    # A primary whose commits do not complete within this long (a probe commit per
    # process, at most one a second) is cut off from its synchronous standbys:
    # every request answers 503 until one completes, reads included, since its
    # rows may be those a failover left behind (core/db/guard.py). 0: off.
    db_commit_probe_s: float = Field(default=2.0, ge=0, le=60)
    # After a request found no writable primary (PostgreSQL down, or a failover in
    # progress), the next requests answer 503 unavailable at once for this long
    # instead of each waiting on a connect: no pile-up while it lasts. 0: off.
    db_unavailable_hold_s: float = Field(default=0.5, ge=0, le=30)
    # Every process reads PostgreSQL's clock (core/db/clock.py) at start and
    # again this often, and takes every time-based decision on it, not on its
    # own wall clock; between readings it counts on its monotonic clock.
    clock_sync_interval_s: float = Field(default=10.0, gt=0, le=3600)
    # A process whose own wall clock is further than this from PostgreSQL's logs
    # ``clock_skew`` (reservo_clock_skew_seconds has the figure): no decision
    # uses that clock, but the machine's time service is broken.
    clock_skew_alert_s: float = Field(default=1.0, gt=0)
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
    # Sized for a morning rush (tens of thousands of patients within a token's
    # life): at 10,000 half of a 20,000-patient storm missed; ~0.4 KB an entry.
    token_cache_size: int = Field(default=50_000, ge=0, le=1_000_000)
    # The longest a bearer token may be valid (401 above it), counted from its
    # iat, and from now whatever iat says: a leaked or carelessly minted token
    # must not open the API for months. `reservo token` stays within it.
    jwt_max_lifetime_s: int = Field(default=24 * 3600, ge=60, le=366 * 86400)
    # An identity provider (Keycloak, Auth0, Entra, Cognito, ...): its tokens
    # (RS256, ES256, EdDSA, ...) are verified against the keys it publishes at
    # this JWKS URL (core/http/jwks.py). None: reservo's own HS256 tokens only.
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
    # Hand the hottest routes' requests to their compiled handler at the end of
    # the request pipeline (core/http/pipeline.py); False reaches the same handler
    # through FastAPI's router (its routing and exception middleware: slower, same
    # answers).
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
    # A request whose Idempotency-Key another request is still running waits this
    # long for that one's answer (and gets it, replayed) before it is answered 409
    # request_in_progress. 0: 409 at once. Below the lease (checked): a request
    # still running after the lease is taken for dead, not waited for.
    idempotency_wait_ms: int = Field(default=2000, ge=0, le=30_000)

    # Outbox relay.
    outbox_batch_size: int = 100
    outbox_poll_interval_s: float = 0.2
    outbox_lease_s: int = 30
    outbox_backoff_base_s: float = 0.5
    # Transient failures are retried forever; the cap keeps work resuming within
    # about a minute of an outage's end.
    outbox_backoff_max_s: float = 60.0

    # Kafka (core/messaging/transport/kafka.py). Unset bootstrap = the in-process local transport.
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
    # reservo's consumer groups also read the topics 0.2.0 published on (one per
    # event, its old name), so records published before the upgrade are not
    # lost; subscribing creates them on a broker that creates topics on demand.
    # False once the groups have read them to their end (docs/OPERATIONS.md,
    # "Upgrading from 0.2.0"). `reservo up --demo` turns it off unless set.
    kafka_legacy_topics: bool = True

    # Notifications. The address channels every message goes to, comma-separated:
    # log, smtp (e-mail), http (SMS); each is delivered and retried on its own.
    # Web Push is on when a VAPID key is set (push_vapid_*), to every browser
    # subscription a contact has.
    notify_channel: str = "log"
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
    # A failed delivery is retried by a `notification_retry` scheduler job, its
    # own channel only, with backoff from the base up to the cap, for as long as
    # the channel stays down.
    notify_retry_base_s: float = Field(default=5.0, gt=0)
    notify_retry_max_s: float = Field(default=300.0, gt=0)
    # Web Push (RFC 8030/8291/8292): the VAPID private key (P-256; the PEM that
    # `vapid --gen` of py-vapid writes, or the raw key base64url) and the subject
    # the push services may reach us at (mailto: or https:). Endpoints obey
    # jobs_http_allow, as `http` jobs do. TTL: how long a push service keeps a
    # message for a browser that is offline.
    push_vapid_private_key: str | None = None
    push_vapid_subject: str | None = None
    push_ttl_s: int = Field(default=86_400, ge=0)

    # Destinations `http` jobs may call although the default policy refuses them
    # (loopback, private, link-local/metadata, reserved ranges; scheduler/egress.py):
    # comma-separated host names, addresses and CIDR networks, each alone (every
    # port) or with one port, e.g. "callbacks.internal:443,10.1.0.0/16,127.0.0.1:8000".
    # Empty: public addresses only (`reservo up --demo` sets its own host:port).
    jobs_http_allow: str = ""

    # The modules' own settings, each read by its class from RESERVO_<MODULE>_*
    # (the names are flat: RESERVO_SCHEDULER_WINDOW_S is scheduler.window_s).
    appointments: AppointmentsSettings = Field(default_factory=AppointmentsSettings)
    scheduler: SchedulerSettings = Field(default_factory=SchedulerSettings)
    rentals: RentalsSettings = Field(default_factory=RentalsSettings)
    wallet: WalletSettings = Field(default_factory=WalletSettings)
    betting: BettingSettings = Field(default_factory=BettingSettings)
    webhooks: WebhooksSettings = Field(default_factory=WebhooksSettings)

    @model_validator(mode="before")
    @classmethod
    def _flat_names_into_groups(cls, data: Any) -> Any:
        """``Settings(scheduler_window_s=1)`` sets scheduler.window_s: the flat
        names (the variables' own) keep working in code. The group is built by
        its class, so its other fields still come from the environment."""
        if not isinstance(data, dict):
            return data
        flat = {key: data.pop(key) for key in list(data) if _group_of(key) is not None}
        for group, fields in _split(flat).items():
            given = data.get(group)
            if isinstance(given, BaseModel):
                data[group] = given.model_copy(update=fields)
            else:
                data[group] = GROUPS[group](**{**(given or {}), **fields})
        return data

    def with_(self, **changes: Any) -> Settings:
        """A copy with these settings changed, by their flat names
        (``with_(db_pool_max=5, scheduler_window_s=2)``); like ``model_copy``, the
        values are not validated. An unknown name is an error, not a no-op."""
        root = {name: value for name, value in changes.items() if name in _ROOT_FIELDS}
        unknown = [name for name in changes if name not in root and _group_of(name) is None]
        if unknown:
            raise TypeError(f"unknown setting(s): {', '.join(sorted(unknown))}")
        flat = {name: value for name, value in changes.items() if name not in root}
        for group, fields in _split(flat).items():
            root[group] = getattr(self, group).model_copy(update=fields)
        return self.model_copy(update=root)

    def model_copy(
        self, *, update: Mapping[str, Any] | None = None, deep: bool = False
    ) -> Settings:
        # A module's flat name here would be set on nothing, silently: with_ maps it.
        unknown = sorted(set(update or ()) - set(Settings.model_fields))
        if unknown:
            raise TypeError(f"not a field of Settings: {', '.join(unknown)} (use with_)")
        return super().model_copy(update=update, deep=deep)

    def flat(self) -> dict[str, object]:
        """Every setting by its flat name (its variable's, less RESERVO_)."""
        values: dict[str, object] = {
            name: getattr(self, name) for name in Settings.model_fields if name not in GROUPS
        }
        for group in GROUPS:
            settings = getattr(self, group)
            values.update(
                {f"{group}_{name}": getattr(settings, name) for name in type(settings).model_fields}
            )
        return values

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

    @field_validator("notify_channel")
    @classmethod
    def _channels(cls, value: str) -> str:
        names = [n.strip() for n in value.split(",") if n.strip()]
        unknown = [n for n in names if n not in NOTIFY_CHANNELS]
        if unknown or not names:
            raise ValueError(
                f"unknown notify channel {', '.join(unknown) or value!r} "
                f"(a comma-separated list of {', '.join(NOTIFY_CHANNELS)})"
            )
        return ",".join(dict.fromkeys(names))

    @field_validator("jobs_http_allow")
    @classmethod
    def _allow_list(cls, value: str) -> str:
        parse_allow(value)  # a typo fails at start, not at the first job
        return value

    # Retention (core/maintenance/retention.py): the `maintenance` role deletes rows nothing
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

    # The invariant checks (`reservo verify`, docs/OPERATIONS.md) the `maintenance`
    # role runs every this many seconds (0: never), exporting
    # reservo_invariant_violations{check}. Read-only, a keyset walk of every
    # table it checks: on a large database a run takes minutes.
    verify_interval_s: float = Field(default=3600.0, ge=0)

    log_level: str = "INFO"
    log_json: bool = True
    # One log line per HTTP request (method, route, status, duration, its ids):
    # the entry a request id finds first (core/kernel/access_log.py). On the hot
    # routes only this share of the requests is logged (1: all; 0.01: 1 in 100);
    # answers of 500 or more, requests slower than access_log_slow_ms and
    # requests of a sampled trace are always logged.
    access_log: bool = True
    access_log_sample: float = Field(default=0.1, ge=0.0, le=1.0)
    access_log_slow_ms: float = Field(default=500.0, gt=0)

    @property
    def replica_urls(self) -> list[str]:
        # Split where a URL starts, not at every comma: one URL may name several
        # hosts (``postgresql://h1:5432,h2:5432/db?target_session_attrs=prefer-standby``).
        parts = re.split(r",\s*(?=postgres(?:ql)?://)", self.database_replica_urls)
        return [url.strip(" ,") for url in parts if url.strip(" ,")]

    @model_validator(mode="after")
    def _idempotency_wait_within_the_lease(self) -> Settings:
        if self.idempotency_wait_ms >= self.idempotency_lease_s * 1000:
            raise ValueError(
                "RESERVO_IDEMPOTENCY_WAIT_MS must be below RESERVO_IDEMPOTENCY_LEASE_S: "
                "a request is taken for dead only once its lease ran out"
            )
        return self

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
    def _several_redis_hosts_name_a_cluster(self) -> Settings:
        # A single Redis has one address; several start-up nodes only make sense
        # for a cluster, and a client given them alone would silently use the first.
        hosts = urlsplit(self.redis_url or "").netloc.rpartition("@")[2]
        if "," in hosts and not self.redis_cluster:
            raise ValueError(
                "RESERVO_REDIS_URL names several hosts: that is a Redis Cluster's "
                "start-up nodes, set RESERVO_REDIS_CLUSTER=true (or name one host)"
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


# Each module's settings, by the name Settings holds them under: that name is
# also the prefix of their flat names (and so of their variables).
GROUPS: dict[str, type[BaseSettings]] = {
    "appointments": AppointmentsSettings,
    "scheduler": SchedulerSettings,
    "rentals": RentalsSettings,
    "wallet": WalletSettings,
    "betting": BettingSettings,
    "webhooks": WebhooksSettings,
}
_ROOT_FIELDS = frozenset(Settings.model_fields) - frozenset(GROUPS)


def _group_of(flat_name: str) -> str | None:
    group, _, name = flat_name.partition("_")
    if group in GROUPS and name in GROUPS[group].model_fields:
        return group
    return None


def _split(flat: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """{"scheduler_window_s": 2} -> {"scheduler": {"window_s": 2}}."""
    groups: dict[str, dict[str, Any]] = {}
    for flat_name, value in flat.items():
        group, _, name = flat_name.partition("_")
        groups.setdefault(group, {})[name] = value
    return groups


def env_name(setting: str) -> str:
    return f"RESERVO_{setting.upper()}"


# Settings whose value is never printed (`reservo config`).
_MASKED = re.compile(r"secret|password|token$|private_key$")


def _shown(name: str, value: object) -> str:
    if value in (None, ""):
        return ""
    if name == "jobs_http_allow":  # as the checks read it: one spelling per destination
        return str(parse_allow(str(value)))
    if _MASKED.search(name):
        return "********"
    text = str(value)
    if isinstance(value, str) and "://" in text:
        # A DSN's password: postgresql://user:pw@host/db -> postgresql://user:***@host/db
        text = re.sub(r"(://[^:/@]+:)[^@]*@", r"\1***@", text)
    return text


def describe(
    settings: Settings, *, changed: Mapping[str, str] | None = None
) -> list[tuple[str, str, str]]:
    """(setting, value as shown, where it came from) for every setting;
    ``changed`` names the ones a command set itself (``reservo up --demo``)."""
    given = {key.upper() for key in os.environ}
    changed = changed or {}
    rows = []
    for name, value in sorted(settings.flat().items()):
        source = changed.get(name) or ("environment" if env_name(name) in given else "default")
        if name == "jobs_http_allow" and not value:
            source += " (none: `http` jobs may call public addresses only)"
        rows.append((name, _shown(name, value), source))
    return rows


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
