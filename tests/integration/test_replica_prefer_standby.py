"""A read replica named as a host list with ``target_session_attrs=prefer-standby``
(the HA set's nodes, docs/OPERATIONS.md): when no standby answered at connect,
the replica's connections land on the primary and it serves nothing; once a
standby answers again, the probe's next connection reaches it and the stale
reads go to it, without a restart. A real hot standby (tests/helpers/replication.py)."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from urllib.parse import urlsplit, urlunsplit

import pytest

from reservo.settings import Settings
from tests.helpers.replication import (
    HotStandbyPair,
    missing_binaries,
    routed,
    serving,
    started_pair,
)
from tests.helpers.waiting import wait_until

WHY_NOT = missing_binaries()


@pytest.fixture(scope="module")
async def pair() -> AsyncIterator[HotStandbyPair]:
    async with started_pair("reservo-prefer-standby-") as p:
        yield p


def both_hosts(pair: HotStandbyPair) -> str:
    """The standby first, then the primary, in one URL: a standby preferred."""
    standby, primary = urlsplit(pair.standby_url), urlsplit(pair.primary_url)
    user = standby.netloc.rpartition("@")[0]
    hosts = f"{standby.netloc.rpartition('@')[2]},{primary.netloc.rpartition('@')[2]}"
    netloc = f"{user}@{hosts}" if user else hosts
    return urlunsplit(standby._replace(netloc=netloc, query="target_session_attrs=prefer-standby"))


async def test_a_host_list_replica_finds_the_standby_back_after_landing_on_the_primary(
    pair: HotStandbyPair, base_settings: Settings
) -> None:
    pair.kill_standby()
    async with routed(pair, base_settings, database_replica_urls=both_hosts(pair)) as (c, _):
        assert c.stale.replicas is not None
        # No standby answers: the connections reach the primary, which the probe
        # tells from a standby.
        await wait_until(lambda: c.stale.replicas.status()[0]["up"] is False)
        await asyncio.sleep(0.5)
        assert not serving(c)
        await pair.restart_standby()
        # Within a few probes (every 0.05 s here) the replica serves again.
        took = await wait_until(lambda: serving(c), timeout_s=10)
        print(f"replica serving {took:.2f} s after the standby was back")
