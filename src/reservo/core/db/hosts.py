"""Connecting to one of the hosts of a multi-host URL, each host for a bounded time.

asyncpg tries the hosts of ``postgresql://u@h1:p1,h2:p2,h3:p3/db`` in order
under ONE timeout: a host that neither answers nor refuses (a partitioned
machine drops the packets) takes all of it, and the hosts after it are never
tried, so a pool whose first host is cut off never reaches the new primary
(tests/chaos/test_partition.py). libpq bounds each host by ``connect_timeout``;
``HostOrder`` does the same for the pool, and tries the host that answered last
first, so after a failover the connections go straight to the new primary
instead of waiting out the lost one each time.
"""

from __future__ import annotations

import asyncio
import socket
from typing import Any
from urllib.parse import parse_qsl, urlencode, urlsplit, urlunsplit

import asyncpg

# Matches asyncpg's own decision (target_session_attrs) host by host: the server
# answered and is not the kind asked for (it is then closed by asyncpg).
_WRONG_KIND = asyncpg.exceptions.TargetServerAttributeNotMatched


def split_hosts(dsn: str) -> list[str]:
    """One single-host URL per host of ``dsn`` (hosts in the authority part,
    comma-separated, as libpq writes them); ``[dsn]`` for a single host."""
    parts = urlsplit(dsn)
    userinfo, at, hosts = parts.netloc.rpartition("@")
    if "," not in hosts:
        return [dsn]
    return [urlunsplit(parts._replace(netloc=f"{userinfo}{at}{h}")) for h in hosts.split(",")]


def _with_attrs(dsn: str, attrs: str) -> str:
    parts = urlsplit(dsn)
    query = dict(parse_qsl(parts.query))
    query["target_session_attrs"] = attrs
    return urlunsplit(parts._replace(query=urlencode(query)))


def _attrs(dsn: str) -> str:
    return dict(parse_qsl(urlsplit(dsn).query)).get("target_session_attrs", "any")


class HostOrder:
    """asyncpg's ``connect`` for a pool (``create_pool(connect=...)``): each host
    gets ``per_host_s`` at most, the last host that answered goes first."""

    def __init__(self, dsn: str, per_host_s: float) -> None:
        self.hosts = split_hosts(dsn)
        self.per_host_s = per_host_s
        self._first = 0

    def _order(self) -> list[int]:
        n = len(self.hosts)
        return [(self._first + i) % n for i in range(n)]

    async def connect(self, dsn: str | None = None, **kwargs: Any) -> asyncpg.Connection:
        """Called by the pool with its own arguments (``dsn`` is the pool's)."""
        conn = await self._connect(dsn, **kwargs)
        self._bound_unacknowledged(conn)
        return conn

    def _bound_unacknowledged(self, conn: asyncpg.Connection) -> None:
        """What is sent on ``conn`` and not acknowledged by the host's TCP within
        ``per_host_s`` fails the connection (TCP_USER_TIMEOUT, Linux): a host cut
        off after the connect is found on the next statement in seconds, not
        after command_timeout. The kernel acknowledges, not PostgreSQL: a busy
        server is not mistaken for a lost one (nor is a commit waiting for a
        standby)."""
        option = getattr(socket, "TCP_USER_TIMEOUT", None)
        # asyncpg has no public accessor for its transport's socket.
        sock = conn._transport.get_extra_info("socket")
        if option is None or sock is None or sock.family == socket.AF_UNIX:
            return
        sock.setsockopt(socket.IPPROTO_TCP, option, int(self.per_host_s * 1000))

    async def _connect(self, dsn: str | None = None, **kwargs: Any) -> asyncpg.Connection:
        if len(self.hosts) == 1:
            return await asyncpg.connect(dsn, **kwargs)
        kwargs.pop("timeout", None)  # the bound is per host here
        wanted = _attrs(self.hosts[0])
        # prefer-standby: a standby if one answers, else any host that answered.
        first = "standby" if wanted == "prefer-standby" else wanted
        found, answered = await self._first_of(self._order(), first, kwargs)
        if found is None and wanted == "prefer-standby" and answered:
            found, _ = await self._first_of(answered, "any", kwargs)
        if found is None:
            assert self._error is not None
            raise self._error
        return found

    async def _first_of(
        self, order: list[int], attrs: str, kwargs: dict[str, Any]
    ) -> tuple[asyncpg.Connection | None, list[int]]:
        """The first host in ``order`` of the kind ``attrs``; else None and the
        hosts that answered but were of another kind (the last error of all in
        ``self._error``)."""
        answered: list[int] = []
        self._error: BaseException | None = None
        for i in order:
            try:
                async with asyncio.timeout(self.per_host_s):
                    conn = await asyncpg.connect(_with_attrs(self.hosts[i], attrs), **kwargs)
            except _WRONG_KIND as exc:
                answered.append(i)
                self._error = exc
                continue
            except (OSError, TimeoutError, asyncpg.PostgresError, asyncpg.InterfaceError) as exc:
                self._error = exc
                continue
            self._first = i
            return conn, answered
        return None, answered
