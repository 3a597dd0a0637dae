"""How many `http` job calls one destination gets at once in this process.

A destination (address and port) has at most ``share`` calls in flight, so a
slow one cannot take every executor slot from the jobs of the others. A call
beyond the share waits its turn while the destination answers (one of its
calls ended, or every one in flight started, less than ``slow_s`` ago), and is
refused (``Busy``: the handler puts its job back) once it does not. Judged by
calls ending, not by how long one call takes: on a loaded machine a call to a
quick destination can take longer than ``slow_s`` while the others still end
one after another. So a burst of jobs due
together to a destination that answers runs at the pace it answers. Putting
each job beyond the share back for a second instead made such a burst come
back a second later as a burst again, its share taken again and the rest put
back again: 2,000 jobs due over 8 s to one loopback listener fired up to 6 s
late (issue 39).
"""

from __future__ import annotations

import asyncio
import contextlib
import math
import time
from collections.abc import AsyncIterator, Hashable
from dataclasses import dataclass, field


class Busy(Exception):
    """The destination has its share of calls in flight, and one of them is slow."""


@dataclass
class _Lane:
    share: asyncio.Semaphore
    # The monotonic start of each call in flight, oldest first, and the end of
    # the last call that ended.
    started: list[float] = field(default_factory=list)
    ended_at: float = -math.inf
    waiting: int = 0


class Destinations:
    def __init__(self, share: int, slow_s: float) -> None:
        self.share, self.slow_s = share, slow_s
        self._lanes: dict[Hashable, _Lane] = {}

    @contextlib.asynccontextmanager
    async def slot(self, key: Hashable) -> AsyncIterator[None]:
        """Holds one of ``key``'s slots for the call; raises Busy when its
        share is taken and it has not answered for ``slow_s``."""
        lane = self._lanes.get(key)
        if lane is None:
            lane = self._lanes[key] = _Lane(asyncio.Semaphore(self.share))
        await self._acquire(key, lane)
        start = time.monotonic()
        lane.started.append(start)
        try:
            yield
        finally:
            lane.started.remove(start)
            lane.ended_at = time.monotonic()
            lane.share.release()
            self._forget_idle(key, lane)

    async def _acquire(self, key: Hashable, lane: _Lane) -> None:
        lane.waiting += 1
        acquired = False
        try:
            while not acquired:
                # Until slow_s after the last sign of an answer (a call that
                # ends meanwhile gives its slot to the first waiter).
                oldest = lane.started[0] if lane.started else time.monotonic()
                left_s = max(lane.ended_at, oldest) + self.slow_s - time.monotonic()
                if left_s <= 0 and lane.share.locked():
                    raise Busy
                with contextlib.suppress(TimeoutError):
                    async with asyncio.timeout(max(left_s, 0.0)):
                        acquired = await lane.share.acquire()
        finally:
            lane.waiting -= 1
            if not acquired:
                self._forget_idle(key, lane)

    def _forget_idle(self, key: Hashable, lane: _Lane) -> None:
        # Lanes live while used: destinations are as many as the jobs' URLs.
        if not lane.started and not lane.waiting and self._lanes.get(key) is lane:
            del self._lanes[key]
