"""Prometheus metrics. Under several API processes, set PROMETHEUS_MULTIPROC_DIR
(``reservo api --workers N`` does) so /metrics aggregates them all.

``render`` answers the format the scraper asks for: OpenMetrics 1.0 (with the
request latency's exemplars, ``# EOF``) to an ``Accept: application/openmetrics-text``,
the Prometheus text format 0.0.4 otherwise. prometheus-client keeps no exemplars
in multiprocess mode (its shared files hold values only), so there the
OpenMetrics answer carries none; ``MULTIPROCESS`` tells the request metrics not
to make them at all."""

from __future__ import annotations

import os

from prometheus_client import (
    REGISTRY,
    CollectorRegistry,
    Counter,
    Gauge,
    Histogram,
    multiprocess,
)
from prometheus_client.exposition import choose_encoder
from prometheus_client.values import MutexValue, ValueClass

# What prometheus-client chose when it was imported: values in shared files
# (PROMETHEUS_MULTIPROC_DIR set then) keep no exemplars.
MULTIPROCESS = ValueClass is not MutexValue

BUILD_INFO = Gauge(
    "reservo_build_info",
    "Always 1; the labels name the running version",
    ["version"],
    multiprocess_mode="max",
)
HTTP_REQUESTS = Counter(
    "reservo_http_requests_total", "HTTP requests", ["method", "route", "status"]
)
HTTP_LATENCY = Histogram(
    "reservo_http_request_seconds",
    "HTTP request latency",
    ["method", "route"],
    buckets=(0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5),
)
# The HTTP server's guard against slow clients (core/http/slow_clients.py).
HTTP_SLOW_CLIENTS = Counter(
    "reservo_http_slow_clients_total",
    "Connections closed because a request's headers or body did not arrive in time",
    ["phase"],
)
HTTP_CONNECTIONS_REFUSED = Counter(
    "reservo_http_connections_refused_total",
    "Connections closed at once because the process had RESERVO_HTTP_MAX_CONNECTIONS open",
)
# Readiness (core/http/health.py): what each process's last check found. Under several
# API processes the lowest wins, so one process that cannot reach it shows.
DEPENDENCY_UP = Gauge(
    "reservo_dependency_up",
    "1 when the dependency answered the last readiness check in time",
    ["dependency"],
    multiprocess_mode="livemin",
)
HTTP_DRAINING = Gauge(
    "reservo_http_draining",
    "1 once SIGTERM began the drain: /readyz answers 503 while requests are still served",
    multiprocess_mode="livemax",
)
BOOKINGS = Counter("reservo_bookings_total", "Successful bookings", ["module"])
CANCELLATIONS = Counter("reservo_cancellations_total", "Successful cancellations", ["module"])
CONFLICTS = Counter(
    "reservo_conflicts_total", "Refused bookings by reason", ["module", "code", "decided_by"]
)
BETS_PLACED = Counter("reservo_bets_placed_total", "Bets placed (stake debited)")
RESULTS_RECEIVED = Counter(
    "reservo_results_received_total", "Match results accepted from the provider", ["held_by"]
)
BETS_SETTLED = Counter("reservo_bets_settled_total", "Bets whose settlement was applied")
OUTBOX_PUBLISHED = Counter("reservo_outbox_published_total", "Outbox events delivered")
OUTBOX_FAILURES = Counter(
    "reservo_outbox_failures_total", "Outbox delivery failures (retried)", ["topic"]
)
OUTBOX_LAG = Histogram(
    "reservo_outbox_lag_seconds",
    "Time from event creation to delivery",
    buckets=(0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 300),
)
OUTBOX_PENDING = Gauge(
    "reservo_outbox_pending", "Events waiting in the outbox", multiprocess_mode="max"
)
OUTBOX_OLDEST = Gauge(
    "reservo_outbox_oldest_pending_seconds",
    "Age of the oldest pending outbox event",
    multiprocess_mode="max",
)
OUTBOX_DEAD = Gauge(
    "reservo_outbox_dead", "Events that exhausted their retries", multiprocess_mode="max"
)
# The invariant checks (reservo/verify) the maintenance role runs: what the last
# run found per check; anything above 0 is a broken promise to look into.
INVARIANT_VIOLATIONS = Gauge(
    "reservo_invariant_violations",
    "Rows breaking an invariant at the last scheduled `reservo verify` run, by check",
    ["check"],
    multiprocess_mode="max",
)
TRANSIENT_FAILURES = Counter(
    "reservo_transient_failures_total",
    "Deliveries that failed because a dependency was away (retried until they succeed)",
    ["consumer"],
)
PARKED = Counter(
    "reservo_dead_letters_total",
    "Events a consumer rejected, parked as dead letters (replayable)",
    ["consumer", "topic"],
)
POISON_ROWS = Counter(
    "reservo_poison_rows_total",
    "Rows a background loop could not process even alone and parked",
    ["loop"],
)

# Idempotency-Key (core/http/idempotency.py): retries that met their key's
# first request still running and waited for it. "answered": it ended within
# the wait (the retry got its answer, or ran itself); "expired": 409.
IDEMPOTENCY_WAITS = Counter(
    "reservo_idempotency_waits_total",
    "Waits of a request for the request in flight with its Idempotency-Key, by how they ended",
    ["outcome"],
)

# Read replicas (core/db/replicas.py): only the reads that may be seconds stale.
BATCH_ITEMS = Histogram(
    "reservo_batch_items",
    "Items served together by one batch (one transaction, statement or Redis command), "
    "per batcher: how much of each batch's cost its items share",
    ["batch"],
    buckets=(1, 2, 4, 8, 16, 32, 64, 128, 256),
)
# core/aio/stalls.py: how late the event loop ran a task that asked to wake.
EVENT_LOOP_LAG = Histogram(
    "reservo_event_loop_lag_seconds",
    "How late this process's event loop woke a task, four times a second: a loop "
    "held by a synchronous call or a process starved of CPU serves nothing meanwhile",
    buckets=(0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30),
)
STALE_READS = Counter(
    "reservo_db_stale_reads_total",
    "Reads that may be seconds stale, by the pool that served them and why",
    ["pool", "reason"],
)
REPLICA_LAG = Gauge(
    "reservo_db_replica_lag_seconds",
    "Upper bound of how far a replica is behind the primary, at its last probe",
    ["replica"],
    multiprocess_mode="livemax",
)
REPLICA_UP = Gauge(
    "reservo_db_replica_up",
    "1 when the replica answered its last probe as a standby",
    ["replica"],
    multiprocess_mode="livemin",
)


def render(accept: str | None = None) -> tuple[bytes, str]:
    """The metrics in the format ``accept`` (a scrape's Accept header) asks for, and its type."""
    encode, content_type = choose_encoder(accept or "")
    if os.environ.get("PROMETHEUS_MULTIPROC_DIR"):
        registry = CollectorRegistry()
        multiprocess.MultiProcessCollector(registry)  # type: ignore[no-untyped-call]
        return encode(registry), content_type
    return encode(REGISTRY), content_type
