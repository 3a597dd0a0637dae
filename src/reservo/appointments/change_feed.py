"""Which doctors' slot lists changed lately, read from PostgreSQL by each API
process: what lets a cached slot list live long in Redis and still be stale at
most a few seconds when both drops of a change were lost.

Every change to a slot list drops it from Redis (after the commit, and again
through the outbox consumer), and Redis may still lose that drop (a failover
that loses its last writes, a drop that never arrived). A short life bounds the
harm, but then a list read rarely is read again from PostgreSQL on almost every
read. Instead, each process asks PostgreSQL once a second what changed: the
module's outbox events (each names its doctor) and the slots generated since
its last marks. A list older than the staleness bound is served only while this
feed has heard from PostgreSQL within the bound and knows of no change to its
doctor since the list was read; otherwise it is read again.

Rows are found by id, and ids are taken before their transaction commits: a row
committed after a row with a higher id was already seen would be skipped. So
each poll reads again from the marks of the newest poll at least ``LOOKBACK_S``
old, and of those rows takes the ones the last poll's snapshot could not see: a
change is missed only if its transaction committed more than ``LOOKBACK_S``
minus the interval after writing its event or slot (an appointment change
writes its event last, just before its commit). A change is marked once, when
first seen: a mark refuses the lists read before it.

The feed runs only in a process that serves slot lists (a worker never
does): it waits for the first ``want`` before its first poll."""

from __future__ import annotations

import asyncio
from collections import deque
from dataclasses import dataclass
from datetime import datetime, timedelta

from reservo.appointments import events, repo
from reservo.core.aio.loops import run_every
from reservo.core.db.database import Database
from reservo.core.kernel.clock import Clock

# How far back each poll reads again (see the module's docstring).
LOOKBACK_S = 3.0
# A mark counts from this much before the time it was seen: a list's age is
# measured on the Redis entry's clock, the marks on this process's.
MARGIN = timedelta(seconds=0.25)


@dataclass(frozen=True, slots=True)
class Marks:
    """How far a poll read: the newest outbox id and slot id it saw, and the
    snapshot it saw them in (which rows with lower ids it could not see yet)."""

    event_id: int
    slot_id: int
    snapshot: str


class SlotChangeFeed:
    """The doctors whose slot lists changed, as this process last heard it from
    PostgreSQL (see the module's docstring)."""

    def __init__(self, db: Database, clock: Clock, *, interval_s: float, keep_s: float) -> None:
        self.db, self.clock = db, clock
        self.interval_s = interval_s
        # A mark is kept as long as a list read before it may live in Redis.
        self.keep = timedelta(seconds=keep_s + 2 * LOOKBACK_S)
        self._changed: dict[int, datetime] = {}  # doctor -> when a poll saw it change
        self._since: datetime | None = None  # a list read before this is never vouched for
        # The recent polls: when each was asked (every change committed before
        # the newest one's time is known) and the marks it read to.
        self._polls: deque[tuple[datetime, Marks]] = deque()
        self._wanted = asyncio.Event()

    def want(self) -> None:
        """Start polling (a list was read from Redis): nothing before that."""
        self._wanted.set()

    def vouches(self, doctor_id: int, read_at: datetime, fresh_s: float) -> bool:
        """Whether a list of ``doctor_id`` read from PostgreSQL at ``read_at``
        shows every change of its doctor committed until ``fresh_s`` ago: the
        feed heard from PostgreSQL within ``fresh_s`` and knows of no change to
        the doctor since the list was read."""
        since = self._since
        if since is None or read_at < since:  # never polled, or read before it could
            return False
        if (self.clock.now() - self._polls[-1][0]).total_seconds() > fresh_s:
            return False
        changed = self._changed.get(doctor_id)
        return changed is None or changed < read_at - MARGIN

    async def run(self, stop: asyncio.Event) -> None:
        """Poll every ``interval_s`` once a list was asked about, until ``stop``."""
        waits = [asyncio.ensure_future(self._wanted.wait()), asyncio.ensure_future(stop.wait())]
        try:
            await asyncio.wait(waits, return_when=asyncio.FIRST_COMPLETED)
        finally:
            for wait in waits:
                wait.cancel()
        if not stop.is_set():
            await run_every(stop, self.interval_s, "slot_change_feed", self.poll)

    async def poll(self) -> None:
        """Read what changed since the marks of the newest poll at least
        ``LOOKBACK_S`` old, and mark its doctors as changed now."""
        asked = self.clock.now()  # every change committed before this is in the answer
        async with self.db.connection() as conn:
            if not self._polls:
                marks = Marks(*await repo.slot_change_marks(conn))
                doctors: list[int] = []
            else:
                back, last = self._read_from(asked), self._polls[-1][1]
                event_id, slot_id, snapshot, doctors = await repo.slot_changes_since(
                    conn,
                    (back.event_id, back.slot_id),
                    (last.event_id, last.slot_id, last.snapshot),
                    events.TOPICS,
                )
                marks = Marks(event_id, slot_id, snapshot)
        seen = self.clock.now()  # after PostgreSQL's answer: after every commit it saw
        for doctor_id in doctors:
            self._changed[doctor_id] = seen
        if self._since is None:
            # A row whose id was taken before the first marks may commit just
            # after them: the lists read within the look-back are not vouched for.
            self._since = seen + timedelta(seconds=LOOKBACK_S)
        self._polls.append((asked, marks))
        self._forget(asked)

    def _read_from(self, now: datetime) -> Marks:
        """The marks of the newest poll at least LOOKBACK_S before ``now`` (the
        oldest kept when none is that old yet)."""
        cutoff = now - timedelta(seconds=LOOKBACK_S)
        chosen = self._polls[0][1]
        for at, marks in self._polls:
            if at > cutoff:
                break
            chosen = marks
        return chosen

    def _forget(self, now: datetime) -> None:
        cutoff = now - timedelta(seconds=LOOKBACK_S)
        # Keep the newest poll at or before the look-back, and every later one.
        while len(self._polls) > 1 and self._polls[1][0] <= cutoff:
            self._polls.popleft()
        old = now - self.keep
        for doctor_id in [d for d, at in self._changed.items() if at < old]:
            del self._changed[doctor_id]
