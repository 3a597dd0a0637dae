"""asyncpg pool, transactions, and the named-SQL loader.

Every SQL statement lives in a ``queries.sql`` file as a named block::

    -- name: try_reserve
    UPDATE time_slot SET ...

Errors leave this module already translated: a refused constraint becomes the
DomainError registered for its name, an unreachable database becomes 503.
"""

from __future__ import annotations

import asyncio
import contextlib
import re
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from importlib import resources
from typing import Any, TypeVar

import asyncpg
import orjson
import structlog
from prometheus_client import Counter

from reservo.core.db.abandon import AbandoningConnection
from reservo.core.db.guard import CommitGuard
from reservo.core.db.hosts import HostOrder
from reservo.core.kernel.errors import DomainError, issue, translate, validation_error

log = structlog.get_logger(__name__)
T = TypeVar("T")

DB_AWAY = Counter(
    "reservo_db_unavailable",
    "Times the database went away (a request failed for want of a writable primary): "
    "for unavailable_hold_s after each, requests answer 503 without trying.",
)

_NAME = re.compile(r"^--\s*name:\s*(?P<name>[A-Za-z_][A-Za-z0-9_]*)\s*$", re.MULTILINE)


class Queries:
    """Named SQL blocks loaded once from a file shipped in a package."""

    def __init__(self, text: str, origin: str = "<string>") -> None:
        self._sql: dict[str, str] = {}
        matches = list(_NAME.finditer(text))
        for i, m in enumerate(matches):
            end = matches[i + 1].start() if i + 1 < len(matches) else len(text)
            body = text[m.end() : end].strip()
            if m["name"] in self._sql:
                raise ValueError(f"{origin}: query {m['name']!r} defined twice")
            self._sql[m["name"]] = body
        self._origin = origin

    @classmethod
    def load(cls, package: str, filename: str = "queries.sql") -> Queries:
        text = resources.files(package).joinpath(filename).read_text(encoding="utf-8")
        return cls(text, f"{package}/{filename}")

    def __getattr__(self, name: str) -> str:
        try:
            return self._sql[name]
        except KeyError:
            raise AttributeError(f"{self._origin} has no query {name!r}") from None

    def names(self) -> list[str]:
        return list(self._sql)


# Errors that mean "the database is not there right now", not "your input is bad".
UNAVAILABLE: tuple[type[BaseException], ...] = (
    OSError,
    asyncio.TimeoutError,
    asyncpg.exceptions.CannotConnectNowError,
    asyncpg.exceptions.ConnectionDoesNotExistError,
    asyncpg.exceptions.ConnectionFailureError,
    asyncpg.exceptions.TooManyConnectionsError,
    asyncpg.exceptions.OperatorInterventionError,
    asyncpg.exceptions.InterfaceError,
    # A server shutting down sends FATAL, then closes. A FATAL that arrives between
    # two statements, before the close is processed, leaves asyncpg consuming it:
    # the next statement fails with this before anything is sent (nothing written).
    asyncpg.exceptions.InternalClientError,
    # A migration of the release being rolled out changed a table this process has
    # a prepared statement on (an added column under `RETURNING *`). Outside a
    # transaction asyncpg prepares it again by itself; inside one it cannot, and
    # has already dropped the stale statement: a retry succeeds (docs/DEPLOY.md).
    asyncpg.exceptions.InvalidCachedStatementError,
    # The server answers but is a standby: a primary demoted by a failover (or, at
    # connect, every host of a multi-host URL read-only while a standby is being
    # promoted: asyncpg's TargetServerAttributeNotMatched, an InternalClientError).
    asyncpg.exceptions.ReadOnlySQLTransactionError,
)
# Errors after which the connection that raised them is useless: dropped from the
# pool rather than handed to the next request.
_BROKEN: tuple[type[BaseException], ...] = (
    asyncpg.exceptions.InternalClientError,
    asyncpg.exceptions.ReadOnlySQLTransactionError,
    # A statement that outlived command_timeout: the server is overloaded or cut
    # off (a partition drops packets: no error ever comes back).
    asyncio.TimeoutError,
)
# Errors that say the host every pooled connection points at is no longer the
# primary, or no longer reachable: all of them are replaced, not only the one
# that failed (each would otherwise cost a request a command_timeout).
_HOST_LOST: tuple[type[BaseException], ...] = (
    asyncpg.exceptions.ReadOnlySQLTransactionError,
    asyncio.TimeoutError,
)


_SQL = Queries.load("reservo.core.db")


def unavailable() -> DomainError:
    return DomainError(
        "unavailable",
        "the database is unreachable; try again shortly",
        headers={"Retry-After": "1"},
    )


async def _init_connection(conn: asyncpg.Connection) -> None:
    for typ in ("json", "jsonb"):
        await conn.set_type_codec(
            typ,
            encoder=lambda v: orjson.dumps(v).decode(),
            decoder=orjson.loads,
            schema="pg_catalog",
        )


async def _reset_connection(conn: asyncpg.Connection) -> None:
    """Runs when a connection goes back to the pool, after asyncpg has rolled back
    any open transaction. asyncpg's default would add a round trip per checkout
    (``SELECT pg_advisory_unlock_all(); CLOSE ALL; UNLISTEN *; RESET ALL``) to undo
    session state reservo never creates: it keeps none, so it works behind
    PgBouncer in transaction mode."""


class Database:
    """A lazily (re)connecting pool. Requests made while PostgreSQL is down get
    503; the pool heals itself when it comes back. It always reaches the
    primary: the reads that may be seconds stale go through ``StaleReads``
    (core/db/replicas.py), built over it."""

    def __init__(
        self,
        dsn: str,
        *,
        min_size: int = 2,
        max_size: int = 20,
        command_timeout: float = 10.0,
        acquire_timeout: float = 5.0,
        statement_cache_size: int = 100,
        connect_timeout: float = 60.0,
        host_timeout_s: float = 2.0,
        unavailable_hold_s: float = 0.0,
        commit_probe_s: float = 0.0,
    ) -> None:
        self.dsn = dsn
        self._kw: dict[str, Any] = {
            # Each host of a multi-host URL bounded on its own (core/db/hosts.py).
            "connect": HostOrder(dsn, host_timeout_s).connect,
            # A timed-out statement's connection is closed, never cancelled: a
            # cancelled commit would become visible unreplicated (core/db/abandon.py).
            "connection_class": AbandoningConnection,
            "min_size": min_size,
            "max_size": max_size,
            "command_timeout": command_timeout,
            "statement_cache_size": statement_cache_size,
            "timeout": connect_timeout,
            "init": _init_connection,
            "reset": _reset_connection,
        }
        self._acquire_timeout = acquire_timeout
        # A primary whose commits stall is cut off from its synchronous standbys:
        # nothing is answered from it (core/db/guard.py).
        self._guard = CommitGuard(self._probe_connection, commit_probe_s, _SQL)
        self._pool: asyncpg.Pool | None = None
        self._lock = asyncio.Lock()
        # After the database failed a request, the following ones answer 503 at once
        # for this long instead of each waiting on a connect or a pool slot: during a
        # failover or an outage, requests do not pile up (nor their memory).
        self._hold_s = unavailable_hold_s
        self._away_until = 0.0
        # Once the hold is over, the database has not answered yet: one request at
        # a time tries it (the trial) and the others still answer 503 at once. A
        # host that accepts connections and never answers (a lost machine) would
        # otherwise cost every request an acquire timeout after every hold.
        self._recovering = False
        self._trial = False

    async def _get_pool(self, *, probe: bool = False) -> asyncpg.Pool:
        if self._pool is not None:
            return self._pool
        async with self._lock:
            if self._pool is None:
                if self.away and not probe:  # it failed while this one waited
                    raise unavailable()
                try:
                    # Bounded like a pool wait: it runs on a request's path.
                    async with asyncio.timeout(self._acquire_timeout):
                        self._pool = await asyncpg.create_pool(self.dsn, **self._kw)
                except UNAVAILABLE as exc:
                    self._went_away(exc)
                    raise unavailable() from exc
        return self._pool

    async def connect(self) -> None:
        await self._get_pool()

    async def _probe_connection(self) -> asyncpg.Connection:
        connect = self._kw["connect"]
        conn: asyncpg.Connection = await connect(
            self.dsn, timeout=self._acquire_timeout, connection_class=AbandoningConnection
        )
        return conn

    async def close(self) -> None:
        await self._guard.close()
        if self._pool is not None:
            await self._pool.close()
            self._pool = None

    @property
    def away(self) -> bool:
        """True while requests answer 503 without trying (after a failure)."""
        return time.monotonic() < self._away_until

    @asynccontextmanager
    async def connection(self, *, probe: bool = False) -> AsyncIterator[asyncpg.Connection]:
        """A pooled connection; ``probe`` tries even while the database is away
        (readiness checks: they are what finds it back)."""
        if not self._guard.trusted():
            raise unavailable()
        if probe or not self._recovering:
            if self.away and not probe:
                raise unavailable()
            async with self._connection(probe=probe) as conn:
                yield conn
            return
        if self.away or self._trial:
            raise unavailable()
        self._trial = True
        try:
            async with self._connection() as conn:
                yield conn
        finally:
            self._trial = False
            if not self.away:  # it answered (a failure would have started a hold)
                self._recovering = False

    @asynccontextmanager
    async def _connection(self, *, probe: bool = False) -> AsyncIterator[asyncpg.Connection]:
        pool = await self._get_pool(probe=probe)
        try:
            async with pool.acquire(timeout=self._acquire_timeout) as conn:
                try:
                    yield conn
                except _BROKEN as exc:
                    await self._drop(pool, conn, exc)
                    raise
        except asyncpg.IntegrityConstraintViolationError as exc:
            raise (translate(exc) or exc) from exc
        except asyncpg.DataError as exc:
            # SQLSTATE class 22 (or asyncpg refusing to encode an argument): a value
            # the database cannot take. Input validation should catch these first;
            # this is the net that keeps bad input from ever becoming a 500. The
            # driver's text names query arguments and internals: it goes to the
            # log, never to the client.
            log.warning(
                "database_data_error",
                error_type=type(exc).__name__,
                sqlstate=getattr(exc, "sqlstate", None),
                error=str(exc),
            )
            raise validation_error(
                "a value is out of range or badly encoded",
                [issue(("request",), "value rejected", "data_error")],
            ) from exc
        except UNAVAILABLE as exc:
            self._went_away(exc)
            raise unavailable() from exc

    async def _drop(self, pool: asyncpg.Pool, conn: asyncpg.Connection, exc: BaseException) -> None:
        """The connection is dead (see UNAVAILABLE), timed out or talks to a
        standby: drop it, so the pool does not hand it to the next request. A
        standby means a failover, a timeout a host cut off or overloaded: every
        other pooled connection points at the same host, so all are replaced (the
        next connect finds the new primary)."""
        log.warning("database_connection_broken", error=repr(exc))
        # Already closed and detached by a timeout (core/db/abandon.py): fine.
        with contextlib.suppress(asyncpg.exceptions.InterfaceError):
            conn.terminate()
        if isinstance(exc, _HOST_LOST):
            await pool.expire_connections()

    def _went_away(self, exc: BaseException) -> None:
        if self._hold_s > 0 and not self.away:
            DB_AWAY.inc()
            log.warning("database_unavailable", error=repr(exc), hold_s=self._hold_s)
        self._away_until = time.monotonic() + self._hold_s
        self._recovering = self._hold_s > 0

    @asynccontextmanager
    async def transaction(self) -> AsyncIterator[asyncpg.Connection]:
        # The transaction of an AbandoningConnection (core/db/abandon.py): a
        # cancelled block raises its CancelledError, not the failed rollback's.
        async with self.connection() as conn, conn.transaction():
            yield conn

    async def ping(self) -> bool:
        try:
            async with self.connection(probe=True) as conn:
                await conn.fetchval("SELECT 1")
            self._away_until = 0.0  # back: requests need not wait out the hold
            self._recovering = False
            return True
        except DomainError:
            return False
