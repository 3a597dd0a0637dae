"""Setup of core's own module, which every deployment has: the outbox (the
``relay`` and ``maintenance`` roles); notifications is a module of its own
(reservo/notifications).

Retention: core's tables are pruned after the settings below, and every other
module declares the rules of its own tables (``Module.retention``); the outbox's
``maintenance`` role runs them all. Not pruned, on purpose (business records a
booking, a refund or an audit needs): appointments, rental bookings and payments
(deposits and refunds; rentals keeps no separate webhook log), the wallet's
transfers and entries, bets, matches and betting_result_inbox (which provider
event settled a match: one row per result)."""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import timedelta

import structlog

from reservo.core.aio import stalls
from reservo.core.aio.loops import run_every
from reservo.core.db.clock import DatabaseClock
from reservo.core.db.database import Database, Queries
from reservo.core.kernel import metrics
from reservo.core.maintenance.partitions import PartitionedTable, PartitionKeeper
from reservo.core.maintenance.retention import Pruner, PruneRule
from reservo.core.messaging.deadletters import LocalDeadLetters
from reservo.core.messaging.outbox import OutboxRelay
from reservo.core.messaging.transport.base import Transport
from reservo.core.messaging.transport.local import LocalTransport
from reservo.core.module import Module, Role
from reservo.settings import Settings
from reservo.shared import Shared, transport_from_settings

log = structlog.get_logger(__name__)
CORE_SQL_http = Queries.load("reservo.core.http")
CORE_SQL_messaging = Queries.load("reservo.core.messaging")
CORE_SQL_notifications = Queries.load("reservo.notifications")
# How often the maintenance role samples the outbox gauges.
OUTBOX_METRICS_PERIOD_S = 5.0
# How much longer than the outbox's retention a day of the inbox or of the
# notification table is kept at least: an event can be delivered again while
# its outbox row is PENDING (the drop's check holds the day then) and, from a
# Kafka consumer that crashed before committing, a little after publication.
PARTITION_MARGIN = timedelta(days=1)


@dataclass(frozen=True, kw_only=True)
class Outbox(Module):
    relay: OutboxRelay
    db: Database

    async def backlog(self) -> dict[str, float]:
        """Work waiting, for /readyz: an outage shows here as a growing backlog
        being retried, not as lost events."""
        async with self.db.connection() as conn:
            row = await conn.fetchrow(CORE_SQL_messaging.backlog, self.relay.clock.now())
        return {
            "outboxPending": row["pending"],
            "outboxRetrying": row["retrying"],
            "outboxOldestSeconds": round(row["oldest_s"], 3),
            "deadEvents": row["dead_events"],
            "deadLetters": row["dead_letters"],
        }


def outbox(shared: Shared, retention: Sequence[PruneRule], duties: Sequence[Role] = ()) -> Outbox:
    """``retention``: the other modules' rules, run by the maintenance role with
    the outbox's own; ``duties``: the other modules' periodic maintenance work
    (``Module.maintenance``), run by the same role."""
    s = shared.settings
    # Kafka when configured; otherwise the relay runs the handlers in-process.
    transport: Transport = (
        transport_from_settings(s, shared.subscriptions.topics, shared.events)
        if s.kafka_bootstrap
        else LocalTransport(
            shared.subscriptions, LocalDeadLetters(shared.db, shared.clock, s.kafka_source)
        )
    )
    relay = OutboxRelay(
        shared.db,
        transport,
        shared.clock,
        batch_size=s.kafka_relay_batch_size if s.kafka_bootstrap else s.outbox_batch_size,
        lease_s=s.outbox_lease_s,
        backoff_base_s=s.outbox_backoff_base_s,
        backoff_max_s=s.outbox_backoff_max_s,
        poll_interval_s=s.outbox_poll_interval_s,
        pipelined=bool(s.kafka_bootstrap),
        events=shared.events,
    )
    own = outbox_retention(s)
    rules = [*own, *retention]
    return Outbox(
        name="outbox",
        relay=relay,
        db=shared.db,
        roles={
            "relay": lambda stop: _relay(relay, stop),
            "maintenance": lambda stop: _maintenance(shared, rules, stop, duties),
        },
        retention=own,
        # Every process watches its event loop for stalls, and keeps reading
        # PostgreSQL's clock (when it is the clock).
        companions=[
            stalls.watch,
            *([shared.clock.run] if isinstance(shared.clock, DatabaseClock) else []),
        ],
    )


def outbox_retention(s: Settings) -> list[PruneRule]:
    """The outbox's own tables: events, the consumers' inbox, idempotency keys
    and dead letters."""
    return [
        PruneRule.by_ctid(
            "idem_prune",
            "idempotency_key",
            CORE_SQL_http.idem_prunable,
            timedelta(hours=s.idempotency_retention_hours),
        ),
        PruneRule(
            "outbox_prune",
            "outbox",
            CORE_SQL_messaging.outbox_prune,
            timedelta(hours=s.retention_outbox_hours),
        ),
        PruneRule(
            "inbox_prune",
            "inbox",
            CORE_SQL_messaging.inbox_prune,
            timedelta(hours=s.retention_inbox_hours),
        ),
        PruneRule.by_ctid(
            "dead_letter_prune",
            "dead_letter",
            CORE_SQL_messaging.dead_letter_prunable,
            timedelta(days=s.retention_dead_letter_days),
        ),
    ]


def partitioned(s: Settings) -> list[PartitionedTable]:
    """Tables partitioned by day (migrations 0025, 0026), dropped a day at a time.
    The outbox after the same retention as its batch rule; DEAD events outlive
    their day (moved to the default partition, where they wait for a replay).
    The inbox and the notification table are partitioned by the day their
    events were created, and dropped after their own retention, never before
    the outbox's plus PARTITION_MARGIN (docs/SCALING.md, "History tables");
    PENDING notifications outlive their day like DEAD events."""
    outbox_keep = timedelta(hours=s.retention_outbox_hours)
    floor = outbox_keep + PARTITION_MARGIN
    return [
        PartitionedTable(
            "outbox",
            outbox_keep,
            CORE_SQL_messaging.outbox_partition_blocked,
            keep_column="status",
            keep_values=("DEAD",),
        ),
        PartitionedTable(
            "inbox",
            max(timedelta(hours=s.retention_inbox_hours), floor),
            CORE_SQL_messaging.inbox_partition_blocked,
            keep_column="consumer",  # no keep_values: nothing outlives an inbox day
        ),
        PartitionedTable(
            "notification",
            max(timedelta(days=s.retention_notification_days), floor),
            CORE_SQL_notifications.notification_partition_blocked,
            keep_column="status",
            keep_values=("PENDING",),
        ),
    ]


async def _maintenance(
    shared: Shared, rules: Sequence[PruneRule], stop: asyncio.Event, duties: Sequence[Role] = ()
) -> None:
    s = shared.settings
    keeper = PartitionKeeper(
        shared.db,
        shared.clock,
        partitioned(s),
        days_ahead=s.retention_partition_days_ahead,
        lock_timeout_ms=s.retention_partition_lock_timeout_ms,
    )
    sample = run_every(
        stop, OUTBOX_METRICS_PERIOD_S, "outbox_metrics", lambda: _sample_outbox(shared)
    )
    if s.retention_enabled:  # every growing table, idempotency keys included
        pruner = Pruner(
            shared.db,
            shared.clock,
            rules,
            batch=s.retention_batch_size,
            pause_s=s.retention_pause_s,
            partitions=keeper,
        )
        prune = run_every(stop, s.retention_interval_s, "retention", lambda: pruner.run(stop))
    else:  # no pruning, but the days ahead are still created (inserts stay routed)
        prune = run_every(stop, s.retention_interval_s, "partitions", keeper.ensure_ahead)
    await asyncio.gather(prune, sample, *(duty(stop) for duty in duties))


async def _relay(relay: OutboxRelay, stop: asyncio.Event) -> None:
    try:
        await relay.transport.start()  # creates the topics; broker down: deliver retries
    except Exception as exc:
        log.warning("transport_start_failed", error=repr(exc))
    try:
        await relay.run(stop)
    finally:
        await relay.transport.stop()


async def _sample_outbox(shared: Shared) -> None:
    async with shared.db.connection() as conn:
        lag = await conn.fetchrow(CORE_SQL_messaging.outbox_lag, shared.clock.now())
        dead = await conn.fetchval(CORE_SQL_messaging.outbox_dead_count)
    metrics.OUTBOX_PENDING.set(lag["pending"])
    metrics.OUTBOX_OLDEST.set(lag["oldest_s"])
    metrics.OUTBOX_DEAD.set(dead)
