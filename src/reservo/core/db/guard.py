"""The commit guard: a primary whose commits do not complete is not trusted at all.

A primary cut off from its synchronous standbys by a partition goes on answering:
its commits wait (nothing it takes is acknowledged), but its reads are those of
a server the failover has left behind. A request answered from there can be a
definitive refusal built on stale rows: measured in tests/chaos/test_partition.py,
a payment webhook for a booking held on the new primary answered 404
``booking_not_found`` by the process still connected to the old one (a provider
does not retry a 404: the payment is lost). So each process commits a probe
(``commit_probe``: an autocommit that writes a commit record and waits for the
standbys like any write), one at a time, at most every ``EVERY_S``, on a server
whose commits wait for synchronous standbys at all; while one has been pending
longer than ``bound_s`` every request answers 503
``unavailable``, reads included, and ``/readyz`` says the database is down,
until a probe commits again. A probe past its bound is left waiting (abandoned,
never cancelled: core/db/abandon.py) on a connection of its own.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING

import asyncpg
import structlog

if TYPE_CHECKING:
    from reservo.core.db.database import Queries

log = structlog.get_logger(__name__)
EVERY_S = 1.0


class CommitGuard:
    """``connect`` opens the probe's own connection (the pool's host order);
    ``sql`` is core/db/queries.sql (``commit_probe``, ``sync_standby_names``).
    ``bound_s`` 0: off."""

    def __init__(
        self, connect: Callable[[], Awaitable[asyncpg.Connection]], bound_s: float, sql: Queries
    ) -> None:
        self._connect = connect
        self.bound_s = bound_s
        self._sql = sql
        self.stalled = False  # a probe's commit outlived the bound, none committed since
        self._conn: asyncpg.Connection | None = None
        self._task: asyncio.Task[None] | None = None
        self._started = -EVERY_S

    def trusted(self) -> bool:
        """False from a probe's commit outliving the bound until a probe commits
        again; starts a probe when one is due (the requests drive it: no loop)."""
        if self.bound_s <= 0:
            return True
        now = time.monotonic()
        if (self._task is None or self._task.done()) and now - self._started >= EVERY_S:
            self._started = now
            self._task = asyncio.get_running_loop().create_task(self._probe())
        return not self.stalled

    async def _probe(self) -> None:
        try:
            if self._conn is None or self._conn.is_closed():
                self._conn = await self._connect()
            # No synchronous standby to wait for (a single server, or a primary
            # the HA manager let commit alone): a slow commit there is load.
            if not await self._conn.fetchval(self._sql.sync_standby_names):
                self.stalled = False
                return
            # Past the bound the probe is abandoned, never cancelled: its commit
            # stays invisible (core/db/abandon.py closes the connection), and the
            # next probe tries a new connection, which may reach another primary.
            async with asyncio.timeout(self.bound_s):
                await self._conn.execute(self._sql.commit_probe)
        except TimeoutError:
            if not self.stalled:
                log.warning("database_commits_stalled", bound_s=self.bound_s)
            self.stalled = True
            self._conn = None
            return
        except (OSError, asyncpg.PostgresError, asyncpg.InterfaceError):
            # No answer at all is the pool's business (503 there); reconnect next time.
            if self._conn is not None:
                self._conn.terminate()
            self._conn = None
            return
        if self.stalled:
            log.warning("database_commits_back")
        self.stalled = False

    async def close(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(BaseException):
                await self._task
        if self._conn is not None:
            self._conn.terminate()
            self._conn = None
