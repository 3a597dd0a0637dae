"""What the retention pruner deletes and after how long: each module's prune
statements (its queries.sql) paired with the settings that say how long rows are
kept. The pruner itself is reservo.core.retention; the `maintenance` role runs it.

Not here, on purpose (business records a booking, a refund or an audit needs):
appointments, rental bookings and payments (deposits and refunds; rentals keeps
no separate webhook log), the wallet's transfers and entries, bets, matches and
betting_result_inbox (which provider event settled a match: one row per result).
"""

from __future__ import annotations

from datetime import timedelta

from reservo.core.clock import Clock
from reservo.core.db import Database, Queries
from reservo.core.partitions import PartitionedTable, PartitionKeeper
from reservo.core.retention import Pruner, PruneRule
from reservo.settings import Settings


def rules(s: Settings) -> list[PruneRule]:
    core = Queries.load("reservo.core")
    jobs = Queries.load("reservo.scheduler")
    betting = Queries.load("reservo.betting")

    def hours(n: int) -> timedelta:
        return timedelta(hours=n)

    def days(n: int) -> timedelta:
        return timedelta(days=n)

    return [
        PruneRule.by_ctid(
            "idem_prune",
            "idempotency_key",
            core.idem_prunable,
            hours(s.idempotency_retention_hours),
        ),
        PruneRule("outbox_prune", "outbox", core.outbox_prune, hours(s.retention_outbox_hours)),
        PruneRule("inbox_prune", "inbox", core.inbox_prune, hours(s.retention_inbox_hours)),
        PruneRule(
            "notification_prune",
            "notification",
            core.notification_prune,
            days(s.retention_notification_days),
        ),
        PruneRule.by_ctid(
            "dead_letter_prune",
            "dead_letter",
            core.dead_letter_prunable,
            days(s.retention_dead_letter_days),
        ),
        PruneRule(
            "job_prune_finished",
            "scheduled_job",
            jobs.job_prune_finished,
            days(s.retention_job_days),
        ),
        PruneRule(
            "job_prune_dead", "scheduled_job", jobs.job_prune_dead, days(s.retention_dead_job_days)
        ),
        PruneRule.by_ctid(
            "fallback_prune",
            "webhook_events_fallback",
            betting.fallback_prunable,
            hours(s.retention_webhook_fallback_hours),
        ),
        PruneRule.by_ctid(
            "rejected_prune",
            "webhook_events_rejected",
            betting.rejected_prunable,
            days(s.retention_webhook_rejected_days),
        ),
    ]


# How much longer than the outbox's retention a day of the inbox or of the
# notification table is kept at least: an event can be delivered again while
# its outbox row is PENDING (the drop's check holds the day then) and, from a
# Kafka consumer that crashed before committing, a little after publication.
PARTITION_MARGIN = timedelta(days=1)


def partitioned(s: Settings) -> list[PartitionedTable]:
    """Tables partitioned by day (migrations 0025, 0026), dropped a day at a time.
    The outbox after the same retention as its batch rule; DEAD events outlive
    their day (moved to the default partition, where they wait for a replay).
    The inbox and the notification table are partitioned by the day their
    events were created, and dropped after their own retention, never before
    the outbox's plus PARTITION_MARGIN (docs/SCALING.md, "History tables");
    PENDING notifications outlive their day like DEAD events."""
    core = Queries.load("reservo.core")
    outbox_keep = timedelta(hours=s.retention_outbox_hours)
    floor = outbox_keep + PARTITION_MARGIN
    return [
        PartitionedTable(
            "outbox",
            outbox_keep,
            core.outbox_partition_blocked,
            keep_column="status",
            keep_values=("DEAD",),
        ),
        PartitionedTable(
            "inbox",
            max(timedelta(hours=s.retention_inbox_hours), floor),
            core.inbox_partition_blocked,
            keep_column="consumer",  # no keep_values: nothing outlives an inbox day
        ),
        PartitionedTable(
            "notification",
            max(timedelta(days=s.retention_notification_days), floor),
            core.notification_partition_blocked,
            keep_column="status",
            keep_values=("PENDING",),
        ),
    ]


def build_partition_keeper(s: Settings, db: Database, clock: Clock) -> PartitionKeeper:
    return PartitionKeeper(
        db,
        clock,
        partitioned(s),
        days_ahead=s.retention_partition_days_ahead,
        lock_timeout_ms=s.retention_partition_lock_timeout_ms,
    )


def build_pruner(s: Settings, db: Database, clock: Clock) -> Pruner:
    return Pruner(
        db,
        clock,
        rules(s),
        batch=s.retention_batch_size,
        pause_s=s.retention_pause_s,
        partitions=build_partition_keeper(s, db, clock),
    )
