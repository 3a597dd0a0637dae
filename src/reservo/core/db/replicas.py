"""Streaming replicas for the reads that may be seconds stale.

A few reads may lag by seconds: the slot list (documented as possibly a few
seconds stale), the car search and the match list (a stale answer costs at most
a 409 at the decision). Those go through ``StaleReads`` and may be served by a hot
standby. Nothing else routes: bookings, holds, transfers, settlement,
idempotency and every check a decision rests on use ``Database.connection`` /
``transaction``, which always reach the primary. ``StaleReads`` is built over the
primary's ``Database`` (which knows nothing of replicas) and the ``Replicas``,
if any: a service asks it for a stale read the same way with or without them.

How far behind a replica is, in seconds of the primary's history, is measured
with this process's monotonic clock (no clock skew between machines; right when
the primary is idle, where ``now() - pg_last_xact_replay_timestamp()`` keeps
growing): each probe round samples the primary's WAL end, then asks every
replica how much WAL it has replayed. A replica that replayed past the sample
taken at ``t`` holds everything the primary committed before ``t``, so at any
later instant its lag is at most ``now - t``. That bound grows by itself between
probes: a replica that stops answering stops serving within ``max_lag_s``.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import math
import time
from collections import deque
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from typing import Any, TypeVar
from urllib.parse import urlsplit

import asyncpg
import structlog

from reservo.core.aio.loops import run_every
from reservo.core.db.database import Database, Queries
from reservo.core.kernel import metrics
from reservo.core.kernel.errors import DomainError

log = structlog.get_logger(__name__)
SQL = Queries.load("reservo.core.db")
T = TypeVar("T")
PRIMARY = "primary"


def several_hosts(dsn: str) -> bool:
    """Whether a PostgreSQL URL names several hosts (``postgresql://h1,h2/db``)."""
    return "," in urlsplit(dsn).netloc


def sampled_before(samples: Sequence[tuple[float, int]], replayed: int) -> float | None:
    """When the newest primary sample (time, WAL end), oldest first, that a replica
    having replayed ``replayed`` holds was taken: it has every commit before then."""
    for at, end in reversed(samples):
        if end <= replayed:
            return at
    return None


@dataclass(kw_only=True)
class Replica:
    name: str
    dsn: str
    db: Database  # the reads' pool
    probe_db: Database  # its own connection: a busy read pool never fails a probe
    # Answered its last probe as a standby, and no read failed on it since.
    up: bool = False
    # Monotonic time of the newest primary sample it had replayed.
    caught_up_at: float = -math.inf

    def lag_s(self, now: float) -> float:
        return now - self.caught_up_at


class Replicas:
    """One pool per replica, a probe every ``probe_interval_s`` (started by
    ``StaleReads.start`` or the first stale read), and the routing of stale reads."""

    def __init__(
        self,
        dsns: Sequence[str],
        *,
        max_lag_s: float,
        probe_interval_s: float,
        timeout_s: float,
        min_size: int = 0,
        max_size: int = 20,
    ) -> None:
        self.max_lag_s = max_lag_s
        self.probe_interval_s = probe_interval_s
        self._timeout_s = timeout_s
        self._sizes = (min_size, max_size)
        self._closing: set[asyncio.Task[None]] = set()
        self.members = [
            Replica(
                name=f"replica{i}",
                dsn=dsn,
                # A replica that does not answer within timeout_s costs the read that
                # time once, then the read goes to the primary.
                db=self._pool(dsn, min_size, max_size),
                probe_db=self._pool(dsn, 0, 1),
            )
            for i, dsn in enumerate(dsns)
        ]
        # Samples the primary on a connection of its own: with the primary's pool
        # exhausted by load, the replicas keep being measured (and used).
        self._primary_probe: Database | None = None
        self._primary_sampled = True
        # (monotonic time just before the query, primary WAL end in bytes)
        self._samples: deque[tuple[float, int]] = deque()
        self._turn = itertools.count()
        self._stop = asyncio.Event()
        self._task: asyncio.Task[None] | None = None

    def _pool(self, dsn: str, min_size: int, max_size: int) -> Database:
        # A floor above 0 has asyncpg reconnect (and log a traceback) every second
        # while a replica is down; the probes find it back anyway.
        t = self._timeout_s
        return Database(
            dsn,
            min_size=min_size,
            max_size=max_size,
            command_timeout=t,
            acquire_timeout=t,
            connect_timeout=t,
            host_timeout_s=t,
        )

    # -- probing ---------------------------------------------------------------

    def start(self, primary: Database) -> None:
        if self._task is None:
            self._stop.clear()
            if self._primary_probe is None:
                self._primary_probe = self._pool(primary.dsn, 0, 1)
            self._task = asyncio.get_running_loop().create_task(
                run_every(self._stop, self.probe_interval_s, "replica_probe", self.probe),
                name="replica-probe",
            )

    async def close(self) -> None:
        if self._task is not None:
            self._stop.set()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
            self._task = None
        for r in self.members:
            await r.db.close()
            await r.probe_db.close()
        await asyncio.gather(*self._closing)
        if self._primary_probe is not None:
            await self._primary_probe.close()
            self._primary_probe = None

    async def probe(self) -> None:
        """One round: sample the primary, then ask every replica."""
        assert self._primary_probe is not None, "start() first"
        at = time.monotonic()
        try:
            async with asyncio.timeout(self._timeout_s), self._primary_probe.connection() as conn:
                end = await conn.fetchval(SQL.primary_wal_position)
            self._samples.append((at, int(end)))
            if not self._primary_sampled:
                log.info("replica_probe_primary_back")
            self._primary_sampled = True
        except Exception as exc:  # a probe reports (once per outage) and goes on
            if self._primary_sampled:
                log.warning("replica_probe_primary_failed", error=repr(exc))
            self._primary_sampled = False
        # Older samples could only prove a lag beyond the bound.
        while self._samples and self._samples[0][0] < at - 2 * self.max_lag_s:
            self._samples.popleft()
        await asyncio.gather(*(self._probe(r) for r in self.members))

    async def _probe(self, r: Replica) -> None:
        try:
            async with asyncio.timeout(self._timeout_s), r.probe_db.connection() as conn:
                row = await conn.fetchrow(SQL.replica_replay_position)
        except Exception as exc:
            self._down(r, "probe_failed", exc)
            return
        if not row["in_recovery"]:
            # Promoted (or a primary listed by mistake): its data is not the primary's.
            self._down(r, "not_a_standby", None)
            if several_hosts(r.dsn):
                self._reconnect(r)
            return
        if row["replayed"] is not None:
            at = sampled_before(self._samples, int(row["replayed"]))
            if at is not None:
                r.caught_up_at = max(r.caught_up_at, at)
        if not r.up:
            log.info("replica_up", replica=r.name)
        r.up = True
        metrics.REPLICA_UP.labels(r.name).set(1)
        lag = r.lag_s(time.monotonic())
        metrics.REPLICA_LAG.labels(r.name).set(lag if math.isfinite(lag) else -1)

    def _reconnect(self, r: Replica) -> None:
        """New pools for a replica whose URL names several hosts (the HA set with
        ``target_session_attrs=prefer-standby``): the host is chosen at connect,
        and a pooled connection that reached a primary (no standby answered then,
        or its node was promoted since) would stay on it while the probes keep it
        busy. The next probe connects again and finds a standby if one answers.
        The old pools close in the background, after the reads still on them."""
        old = (r.db, r.probe_db)
        r.db = self._pool(r.dsn, *self._sizes)
        r.probe_db = self._pool(r.dsn, 0, 1)
        for db in old:
            task = asyncio.create_task(db.close())
            self._closing.add(task)
            task.add_done_callback(self._closing.discard)

    def _down(self, r: Replica, why: str, exc: BaseException | None) -> None:
        if r.up:
            log.warning("replica_down", replica=r.name, reason=why, error=repr(exc))
        r.up = False
        metrics.REPLICA_UP.labels(r.name).set(0)

    # -- routing ---------------------------------------------------------------

    def pick(self) -> Replica | None:
        """A replica within the lag bound (in turn), or None: use the primary."""
        now = time.monotonic()
        serving = [r for r in self.members if r.up and r.lag_s(now) <= self.max_lag_s]
        return serving[next(self._turn) % len(serving)] if serving else None

    async def read(
        self,
        primary: Database,
        read: Callable[[asyncpg.Connection], Awaitable[T]],
    ) -> T:
        self.start(primary)
        replica = self.pick()
        reason = "replicas_behind"  # every replica down, lagging, or not probed yet
        if replica is not None:
            try:
                async with replica.db.connection() as conn:
                    result = await read(conn)
            except DomainError as exc:
                if exc.code == "unavailable":  # gone: left out until a probe finds it back
                    self._down(replica, "read_failed", exc)
                    reason = "replica_failed"
                else:
                    raise
            except asyncpg.exceptions.SerializationError:
                # Cancelled by a conflict with the replay (hot standby): the replica
                # is fine, this read is not.
                reason = "replica_failed"
            else:
                metrics.STALE_READS.labels(replica.name, "replica").inc()
                return result
        async with primary.connection() as conn:
            result = await read(conn)
        metrics.STALE_READS.labels(PRIMARY, reason).inc()
        return result

    def status(self) -> list[dict[str, Any]]:
        """For /readyz: detail only, a replica down never fails readiness."""
        now = time.monotonic()
        out = []
        for r in self.members:
            lag = r.lag_s(now)
            out.append(
                {
                    "name": r.name,
                    "up": r.up,
                    "lagSeconds": round(lag, 3) if math.isfinite(lag) else None,
                    "serving": r.up and lag <= self.max_lag_s,
                }
            )
        return out


class StaleReads:
    """The reads that may be seconds stale by contract (never one a decision is
    taken on): on a replica within the lag bound when there are replicas, else
    on the primary."""

    def __init__(self, primary: Database, replicas: Replicas | None = None) -> None:
        self.primary = primary
        self.replicas = replicas

    @property
    def may_lag(self) -> bool:
        """True when a read may come from a replica, so it may predate a change
        the primary already has (a cache filled from it should live shorter)."""
        return self.replicas is not None

    def start(self) -> None:
        """Starts probing the replicas (the first read would, later)."""
        if self.replicas is not None:
            self.replicas.start(self.primary)

    async def close(self) -> None:
        if self.replicas is not None:
            await self.replicas.close()

    def status(self) -> list[dict[str, Any]] | None:
        """For /readyz (detail only); None without replicas."""
        return None if self.replicas is None else self.replicas.status()

    async def read(self, read: Callable[[asyncpg.Connection], Awaitable[T]]) -> T:
        """Run ``read`` on a replica within the lag bound, else on the primary. A
        replica failing it is re-asked to the primary, once: a replica's death
        never becomes an error. What a lagging replica may answer about a row
        created since (``doctor_not_found``) is the caller's to ``recheck``."""
        if self.replicas is None:
            async with self.primary.connection() as conn:
                return await read(conn)
        return await self.replicas.read(self.primary, read)

    async def recheck(self, read: Callable[[asyncpg.Connection], Awaitable[T]]) -> T:
        """``read`` on the primary, for what a replica's answer may have missed
        (a row created since it was replayed: a doctor's 404), counted as a
        recheck."""
        async with self.primary.connection() as conn:
            result = await read(conn)
        metrics.STALE_READS.labels(PRIMARY, "recheck").inc()
        return result
