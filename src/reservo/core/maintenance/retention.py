"""Retention: one pruner for every table that grows with traffic (outbox, inbox,
notifications, finished jobs, dead letters, webhook logs, idempotency keys).

Each module declares its prune statements in its own ``queries.sql`` (named
``*_prune``), and its setup pairs each with how long its rows are kept
(``Module.retention``). Most tables need no statement of their own: their
module declares which rows may go (``*_prunable``: their ctids older than ``$1``,
oldest first) and core's ``prune_by_ctid`` deletes a batch of them
(``PruneRule.by_ctid``). Every statement has one shape: ``$1`` is the cutoff
(rows older than it may go), ``$2`` the batch size, and it returns one row whose
columns name the tables it deleted from and count the rows (a job's prune also
deletes its executions). A statement deletes at most one batch, oldest first,
and skips rows locked right now (``FOR UPDATE SKIP LOCKED``), so:

- each batch is its own short transaction (one autocommitted statement, on a
  connection taken from the pool for that batch only), and a pause between
  batches leaves the hot paths the database;
- pruning never waits for a row lock held by the hot path, and the hot path
  waits at most for one batch;
- what a statement must never delete (pending events, unsent notifications,
  unfinished jobs, dead letters not replayed) is excluded by its own WHERE.

Tables partitioned by day (reservo.core.maintenance.partitions: the outbox, the inbox and
the notification table) are first
handed to the ``PartitionKeeper``, which creates their next days and drops the
old days whole; their batch statements then only see what a drop leaves (the
default partition, and days still holding a row that must stay).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import timedelta

import structlog
from prometheus_client import Counter

from reservo.core.aio.loops import pause
from reservo.core.db.database import Database, Queries
from reservo.core.kernel.clock import Clock
from reservo.core.kernel.errors import DomainError
from reservo.core.maintenance.partitions import PartitionKeeper, PartitionResult

log = structlog.get_logger(__name__)
Q = Queries.load("reservo.core.maintenance")

PRUNED = Counter("reservo_pruned_rows_total", "Rows deleted by the retention pruner", ["table"])


@dataclass(frozen=True)
class PruneRule:
    """Rows of ``table`` older than ``keep`` go, deleted by ``sql`` (see the module
    docstring for its shape). ``name`` is the statement's name, for the logs."""

    name: str
    table: str
    sql: str
    keep: timedelta

    @classmethod
    def by_ctid(cls, name: str, table: str, prunable: str, keep: timedelta) -> PruneRule:
        """The rule deleting the rows of ``table`` that ``prunable`` finds."""
        return cls(name, table, prune_by_ctid(table, prunable), keep)


def prune_by_ctid(table: str, prunable: str) -> str:
    """The batch statement deleting the rows of ``table`` that ``prunable`` (a
    module's ``*_prunable`` query) finds: core's ``prune_by_ctid`` filled in."""
    return Q.prune_by_ctid.format(table=table, prunable=prunable.removesuffix(";"))


@dataclass
class RuleResult:
    name: str
    table: str
    batches: int = 0
    # Rows deleted per table (the rule's own table, and any it deletes with it).
    rows: dict[str, int] = field(default_factory=dict)
    # The largest single batch of the rule's own table: never above the batch size.
    largest_batch: int = 0


class Pruner:
    def __init__(
        self,
        db: Database,
        clock: Clock,
        rules: Sequence[PruneRule],
        *,
        batch: int = 5000,
        pause_s: float = 0.05,
        partitions: PartitionKeeper | None = None,
    ) -> None:
        if batch < 1:
            raise ValueError("batch must be at least 1")
        self.db, self.clock, self.rules = db, clock, list(rules)
        self.batch, self.pause_s = batch, pause_s
        self.partitions = partitions
        # What the last run's partition step did (created, dropped, held, busy).
        self.last_partitions: list[PartitionResult] = []

    async def run(self, stop: asyncio.Event | None = None) -> list[RuleResult]:
        """One pass over every rule, each until it finds less than a full batch
        (or ``stop`` is set). Logs one line with the counts."""
        started = time.perf_counter()
        if self.partitions is not None:
            # Before the batches: a day that can go whole must not go row by row.
            self.last_partitions = await self._partitions(self.partitions, stop)
        results: list[RuleResult] = []
        for rule in self.rules:
            if stop is not None and stop.is_set():
                break
            try:
                results.append(await self._prune(rule, stop))
            except DomainError:
                raise  # the database is away: the whole run waits for the next period
            except Exception:
                # One broken statement (a table a deploy has not created yet) must
                # not keep the other tables growing.
                log.exception("retention_rule_failed", rule=rule.name, table=rule.table)
        totals: dict[str, int] = {}
        for r in results:
            for table, n in r.rows.items():
                totals[table] = totals.get(table, 0) + n
        log.info(
            "retention_pruned",
            rows=totals,
            batches=sum(r.batches for r in results),
            seconds=round(time.perf_counter() - started, 3),
        )
        return results

    async def _partitions(
        self, keeper: PartitionKeeper, stop: asyncio.Event | None
    ) -> list[PartitionResult]:
        try:
            await keeper.ensure_ahead()
            return await keeper.retire_old(stop)
        except DomainError:
            raise
        except Exception:
            # The batch rules still run: they prune the old days by rows instead.
            log.exception("retention_partitions_failed")
            return []

    async def _prune(self, rule: PruneRule, stop: asyncio.Event | None) -> RuleResult:
        # One cutoff per run: rows that age past it during the run wait for the next.
        cutoff = self.clock.now() - rule.keep
        result = RuleResult(rule.name, rule.table, rows={rule.table: 0})
        rows = result.rows
        while True:
            async with self.db.connection() as conn:
                record = await conn.fetchrow(rule.sql, cutoff, self.batch)
            result.batches += 1
            assert record is not None
            for table, n in record.items():
                if n:
                    rows[table] = rows.get(table, 0) + n
                    PRUNED.labels(table=table).inc(n)
            own = int(record[rule.table])
            result.largest_batch = max(result.largest_batch, own)
            if own < self.batch:
                return result
            if await _paused(stop, self.pause_s):
                return result


async def _paused(stop: asyncio.Event | None, seconds: float) -> bool:
    """Sleep between batches; True when ``stop`` was set meanwhile."""
    if stop is None:
        await asyncio.sleep(seconds)
        return False
    return await pause(stop, seconds)
