"""A multi-host database URL whose first host neither answers nor refuses (a
machine cut off by a partition drops the packets): the pool still connects, to
the next host, after RESERVO_DB_HOST_TIMEOUT_S, and the next connects go to the
host that answered first (core/db/hosts.py). asyncpg alone bounds every host by
one timeout, which the silent host used up: no connection at all. The whole
scenario, under pg_auto_failover in a network lab: tests/chaos/test_partition.py."""

from __future__ import annotations

import socket
import time
from collections.abc import Iterator
from urllib.parse import urlsplit, urlunsplit

import pytest

from reservo.core.db.database import Database
from reservo.core.db.hosts import HostOrder, split_hosts
from reservo.core.kernel.errors import DomainError

pytestmark = pytest.mark.timeout(60)
HOST_TIMEOUT_S = 0.5


@pytest.fixture
def silent_port() -> Iterator[int]:
    """A port whose connections complete the TCP handshake (the kernel's backlog)
    and then hear nothing: the server never accepts, never answers."""
    with socket.create_server(("127.0.0.1", 0), backlog=64) as sock:
        yield sock.getsockname()[1]


def behind(silent: int, url: str, attrs: str) -> str:
    """``url``'s host with a silent host before it."""
    parts = urlsplit(url)
    userinfo, _, host = parts.netloc.rpartition("@")
    netloc = f"{userinfo}@127.0.0.1:{silent},{host}"
    query = f"target_session_attrs={attrs}"
    return urlunsplit(parts._replace(netloc=netloc, query=query))


def test_split_hosts_keeps_everything_but_the_other_hosts() -> None:
    url = "postgresql://u:p@a:1,b:2/db?target_session_attrs=read-write"
    assert split_hosts(url) == [
        "postgresql://u:p@a:1/db?target_session_attrs=read-write",
        "postgresql://u:p@b:2/db?target_session_attrs=read-write",
    ]
    assert split_hosts("postgresql://u@a:1/db") == ["postgresql://u@a:1/db"]


async def test_a_silent_first_host_costs_one_host_timeout(
    database_url: str, silent_port: int
) -> None:
    url = behind(silent_port, database_url, "read-write")
    db = Database(url, min_size=0, max_size=2, acquire_timeout=3, host_timeout_s=HOST_TIMEOUT_S)
    try:
        t0 = time.monotonic()
        async with db.connection() as conn:
            assert await conn.fetchval("SELECT 1") == 1
        took = time.monotonic() - t0
        assert HOST_TIMEOUT_S <= took < 2.5, took
    except DomainError as exc:
        pytest.fail(f"no connection through the second host: {exc}")
    finally:
        await db.close()


async def test_the_host_that_answered_is_tried_first(database_url: str, silent_port: int) -> None:
    url = behind(silent_port, database_url, "read-write")
    order = HostOrder(url, HOST_TIMEOUT_S)
    first = await order.connect(url)
    t0 = time.monotonic()
    second = await order.connect(url)
    took = time.monotonic() - t0
    await first.close()
    await second.close()
    assert took < HOST_TIMEOUT_S, f"the silent host was tried again: {took:.2f} s"


async def test_prefer_standby_takes_a_primary_when_no_standby_answers(
    database_url: str, silent_port: int
) -> None:
    url = behind(silent_port, database_url, "prefer-standby")
    conn = await HostOrder(url, HOST_TIMEOUT_S).connect(url)
    try:
        assert await conn.fetchval("SELECT pg_is_in_recovery()") is False
    finally:
        await conn.close()


@pytest.mark.skipif(not hasattr(socket, "TCP_USER_TIMEOUT"), reason="Linux only")
async def test_what_a_host_does_not_acknowledge_fails_the_connection_in_a_host_timeout(
    database_url: str,
) -> None:
    """A host cut off after the connect: what is sent to it is never acknowledged,
    and the kernel fails the connection after RESERVO_DB_HOST_TIMEOUT_S instead of
    the statement waiting out command_timeout (measured under a partition in
    tests/chaos/test_partition.py)."""
    db = Database(database_url, min_size=0, max_size=1, host_timeout_s=HOST_TIMEOUT_S)
    try:
        async with db.connection() as conn:
            sock = conn._transport.get_extra_info("socket")
            bound = sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_USER_TIMEOUT)
        assert bound == HOST_TIMEOUT_S * 1000
    finally:
        await db.close()
