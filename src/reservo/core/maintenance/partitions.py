"""Day partitions of history tables: created ahead, dropped whole once old.

A table partitioned by day (UTC) on a time column (migration 0025: the outbox by
``created_at``; 0026: the inbox and the notification table by their events'
``event_created_at``) gets its next days' partitions created ahead of time, so its
inserts land in a day partition, and a ``DEFAULT`` partition takes any row no
day covers (an insert never fails; the batch pruner prunes it).

A day partition whose whole range is older than the retention cutoff is
*retired*: detached and dropped, which writes almost no WAL and leaves no dead
tuples behind, instead of deleting its rows one batch at a time. Rows that must
never be dropped (an event still pending) keep their partition: the check runs
under an ACCESS EXCLUSIVE lock on the table, in the transaction that drops, so
no row can change between the check and the drop; a partition the check refuses
stays, and the batch pruner deletes its finished rows meanwhile. Rows kept
forever (DEAD events, for a replay) are few: they are moved to the default
partition by the same transaction, so such rows never pin a partition and the
number of partitions stays bounded.

The lock is taken with a short ``lock_timeout``: waiting behind a long
transaction would queue every writer of the table behind the drop. A drop that
cannot get it tries again a few times, then leaves the partition for the next
run (the batch pruner may take some of its rows meanwhile).
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import UTC, date, datetime, timedelta

import asyncpg
import structlog
from prometheus_client import Counter

from reservo.core.db.database import Database, Queries
from reservo.core.kernel.clock import Clock

log = structlog.get_logger(__name__)
Q = Queries.load("reservo.core.maintenance")

DROPPED = Counter(
    "reservo_partitions_dropped_total", "Day partitions retention dropped whole", ["table"]
)
CREATED = Counter("reservo_partitions_created_total", "Day partitions created ahead", ["table"])


@dataclass(frozen=True)
class PartitionedTable:
    """``table`` is partitioned by day; its rows go after ``keep``. ``blocked_sql``
    ($1 lower bound, $2 upper bound, $3 cutoff) says whether a day holds a row
    a drop must not take; rows whose ``keep_column`` is one of ``keep_values``
    survive a drop (moved to the default partition)."""

    table: str
    keep: timedelta
    blocked_sql: str
    keep_column: str
    keep_values: tuple[str, ...] = ()


@dataclass
class PartitionResult:
    table: str
    created: list[str] = field(default_factory=list)
    dropped: list[str] = field(default_factory=list)
    # Old enough, but holding a row the drop must not take: left to batches.
    held: list[str] = field(default_factory=list)
    # Old enough, but the lock was not granted in time: tried again next run.
    busy: list[str] = field(default_factory=list)
    # Rows kept from dropped partitions (moved to the default partition).
    kept_rows: int = 0


class PartitionKeeper:
    def __init__(
        self,
        db: Database,
        clock: Clock,
        tables: Sequence[PartitionedTable],
        *,
        days_ahead: int = 7,
        lock_timeout_ms: int = 200,
        lock_tries: int = 3,
        pause_s: float = 0.5,
    ) -> None:
        if days_ahead < 1 or lock_tries < 1:
            raise ValueError("days_ahead and lock_tries must be at least 1")
        self.db, self.clock, self.tables = db, clock, list(tables)
        self.days_ahead, self.lock_timeout_ms = days_ahead, lock_timeout_ms
        self.lock_tries, self.pause_s = lock_tries, pause_s

    async def ensure_ahead(self) -> list[PartitionResult]:
        """Today's partition and the next ``days_ahead`` days', for every table."""
        today = _utc_day(self.clock.now())
        results = []
        for t in self.tables:
            result = PartitionResult(t.table)
            for d in range(self.days_ahead + 1):
                day = today + timedelta(days=d)
                name = f"{t.table}_p{day:%Y%m%d}"
                try:
                    if await self._add(t.table, day):
                        result.created.append(name)
                        CREATED.labels(table=t.table).inc()
                except asyncpg.LockNotAvailableError:
                    result.busy.append(name)  # days ahead: the next run has time
            if result.created or result.busy:
                log.info(
                    "partitions_created",
                    table=t.table,
                    partitions=result.created,
                    busy=result.busy,
                )
            results.append(result)
        return results

    async def _add(self, table: str, day: date) -> bool:
        async with self.db.transaction() as conn:
            await conn.execute(Q.partition_lock_timeout, str(self.lock_timeout_ms))
            return bool(await conn.fetchval(Q.partition_add, table, day))

    async def retire_old(self, stop: asyncio.Event | None = None) -> list[PartitionResult]:
        """Drops every day partition wholly older than its table's cutoff whose
        rows may all go; returns what was dropped, held and left busy."""
        results = []
        for t in self.tables:
            cutoff = self.clock.now() - t.keep
            result = PartitionResult(t.table)
            async with self.db.connection() as conn:
                parts = await conn.fetch(Q.partition_list, t.table)
            for part in parts:
                if stop is not None and stop.is_set():
                    break
                if part["upper_bound"] > cutoff:
                    break  # oldest first: every later one is younger
                await self._retire(t, part, cutoff, result)
            if result.dropped or result.held or result.busy:
                log.info(
                    "partitions_retired",
                    table=t.table,
                    dropped=result.dropped,
                    held=result.held,
                    busy=result.busy,
                    kept_rows=result.kept_rows,
                )
            results.append(result)
        return results

    async def _retire(
        self, t: PartitionedTable, part: asyncpg.Record, cutoff: datetime, result: PartitionResult
    ) -> None:
        name, lower, upper = part["name"], part["lower_bound"], part["upper_bound"]
        # Without the lock first: a day that is clearly held costs no lock at all.
        async with self.db.connection() as conn:
            if await conn.fetchval(t.blocked_sql, lower, upper, cutoff):
                result.held.append(name)
                return
        for attempt in range(self.lock_tries):
            try:
                async with self.db.transaction() as conn:
                    await conn.execute(Q.partition_lock_timeout, str(self.lock_timeout_ms))
                    await conn.execute(Q.partition_lock, t.table)
                    # Under the lock: no row of the day can change until the drop commits.
                    if await conn.fetchval(t.blocked_sql, lower, upper, cutoff):
                        result.held.append(name)
                        return
                    kept = await conn.fetchval(
                        Q.partition_retire, t.table, name, t.keep_column, list(t.keep_values)
                    )
            except asyncpg.LockNotAvailableError:
                if attempt + 1 < self.lock_tries:
                    await asyncio.sleep(self.pause_s)
                continue
            if kept is not None:  # None: another process retired it meanwhile
                result.dropped.append(name)
                result.kept_rows += int(kept)
                DROPPED.labels(table=t.table).inc()
            return
        result.busy.append(name)


def _utc_day(at: datetime) -> date:
    """The UTC day of an instant (the partitions' days are UTC days)."""
    return at.astimezone(UTC).date()
