"""asyncpg pool, transactions, and the named-SQL loader.

Every SQL statement lives in a ``queries.sql`` file as a named block::

    -- name: try_reserve
    UPDATE time_slot SET ...

Errors leave this module already translated: a refused constraint becomes the
DomainError registered for its name, an unreachable database becomes 503.
"""

from __future__ import annotations

import asyncio
import re
from collections.abc import AsyncIterator, Awaitable, Callable, Collection
from contextlib import asynccontextmanager
from importlib import resources
from typing import TYPE_CHECKING, Any, TypeVar

import asyncpg
import orjson
import structlog

from reservo.core.errors import DomainError, translate, validation_error

if TYPE_CHECKING:
    from reservo.core.replicas import Replicas

log = structlog.get_logger(__name__)
T = TypeVar("T")

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
)


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
    503; the pool heals itself when it comes back. With ``replicas``, the reads
    that may be seconds stale (``stale_read``) go to a streaming replica."""

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
        replicas: Replicas | None = None,
    ) -> None:
        self.dsn = dsn
        self._kw: dict[str, Any] = {
            "min_size": min_size,
            "max_size": max_size,
            "command_timeout": command_timeout,
            "statement_cache_size": statement_cache_size,
            "timeout": connect_timeout,
            "init": _init_connection,
            "reset": _reset_connection,
        }
        self._acquire_timeout = acquire_timeout
        self._pool: asyncpg.Pool | None = None
        self._lock = asyncio.Lock()
        self.replicas = replicas

    async def _get_pool(self) -> asyncpg.Pool:
        if self._pool is not None:
            return self._pool
        async with self._lock:
            if self._pool is None:
                try:
                    self._pool = await asyncpg.create_pool(self.dsn, **self._kw)
                except UNAVAILABLE as exc:
                    raise unavailable() from exc
        return self._pool

    async def connect(self) -> None:
        if self.replicas is not None:
            self.replicas.start(self)
        await self._get_pool()

    async def close(self) -> None:
        if self.replicas is not None:
            await self.replicas.close()
        if self._pool is not None:
            await self._pool.close()
            self._pool = None

    @asynccontextmanager
    async def connection(self) -> AsyncIterator[asyncpg.Connection]:
        pool = await self._get_pool()
        try:
            async with pool.acquire(timeout=self._acquire_timeout) as conn:
                try:
                    yield conn
                except asyncpg.exceptions.InternalClientError as exc:
                    # The connection is dead (see UNAVAILABLE): drop it, so the
                    # pool does not hand it to the next request.
                    log.warning("database_connection_broken", error=repr(exc))
                    conn.terminate()
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
                [{"loc": [], "msg": "value rejected", "type": "data_error"}],
            ) from exc
        except UNAVAILABLE as exc:
            raise unavailable() from exc

    async def stale_read(
        self,
        read: Callable[[asyncpg.Connection], Awaitable[T]],
        *,
        recheck: Collection[str] = (),
    ) -> T:
        """Run ``read``, a read whose answer may be seconds stale by contract (never
        one a decision is taken on), on a replica within the lag bound, else on
        the primary. A replica failing it is re-asked to the primary, once: a
        replica's death never becomes an error. ``recheck`` lists error codes a
        lagging replica may give about a row created since (``doctor_not_found``):
        the primary confirms them."""
        if self.replicas is None:
            async with self.connection() as conn:
                return await read(conn)
        return await self.replicas.read(self, read, recheck)

    @asynccontextmanager
    async def transaction(self) -> AsyncIterator[asyncpg.Connection]:
        async with self.connection() as conn, conn.transaction():
            yield conn

    async def ping(self) -> bool:
        try:
            async with self.connection() as conn:
                await conn.fetchval("SELECT 1")
            return True
        except DomainError:
            return False
