"""Lose a machine, lose nothing: reservo's real processes under the chaos suite's
mixed HTTP load (every write under an Idempotency-Key, retried with the same key
until definitive) while the PostgreSQL primary's machine dies (its keeper and its
PostgreSQL SIGKILLed: pg_auto_failover promotes a synchronous standby), while a
standby in the synchronous set dies and then the primary, and while a Redis
Cluster master dies (its replica takes over).

The topology is tests/ha.py's (scripts/ha.sh starts the same): a primary and two
standbys with ``synchronous_standby_names = ANY 1 (...)`` and a 3+3 Redis Cluster.
reservo is given the three PostgreSQL nodes in one URL with
``target_session_attrs=read-write`` and is never restarted. After each scenario
the killed nodes are started again (they rejoin as standbys / replicas), and the
checks of tests/chaos/checks.py read the whole history against the database:
every 2xx has its effect exactly once, money is conserved, no slot is over
capacity, every job ran once, no 5xx other than 503."""

from __future__ import annotations

import asyncio
import contextlib
import shutil
import tempfile
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import cast

import httpx
import pytest

from reservo.core.embedded import EmbeddedKafka
from tests.chaos import report
from tests.chaos.fakes import HttpRecorder, SmtpRecorder
from tests.chaos.load import ADMIN, Client, Ledger, Traffic, book_appointment, make_fixtures
from tests.chaos.scenario import World, _failures, healed, scenario
from tests.chaos.stack import Infra, Reservo
from tests.ha import HaPostgres, missing
from tests.helpers.procs import free_port
from tests.redis_cluster import LocalCluster

pytestmark = [pytest.mark.chaos, pytest.mark.failover, pytest.mark.timeout(900)]

PG_GOAL_S = 15.0
REDIS_GOAL_S = 5.0


@dataclass
class HaInfra:
    """What tests/chaos/stack.Reservo needs of an Infra, on the HA topology."""

    root: Path
    pg: HaPostgres = field(init=False)
    redis: LocalCluster = field(init=False)
    kafka: EmbeddedKafka = field(init=False)
    database_url: str = ""
    redis_url: str = ""
    bootstrap: str = ""

    def __post_init__(self) -> None:
        self.pg = HaPostgres(self.root / "pg")
        self.redis = LocalCluster(self.root / "redis", node_timeout_ms=2000)
        self.kafka = EmbeddedKafka(self.root, port=free_port())

    def start(self) -> None:
        self.pg.start()
        self.redis.start()
        self.bootstrap = self.kafka.start()
        self.database_url = self.pg.url
        # The start-up node is one the test never kills.
        self.redis_url = f"redis://127.0.0.1:{self.redis.ports[0]}/0"

    def stop(self) -> None:
        for stop in (self.kafka.stop, self.redis.stop, self.pg.stop):
            with contextlib.suppress(Exception):
                stop()


@pytest.fixture(scope="module")
async def ha_world(tmp_path_factory: pytest.TempPathFactory) -> AsyncIterator[World]:
    if why := missing():
        pytest.skip(why)
    logs = Path(tmp_path_factory.mktemp("failover"))
    data = Path(tempfile.mkdtemp(prefix="reservo-failover-"))
    infra = HaInfra(data)
    smtp, gateway, recorder = SmtpRecorder(), HttpRecorder("gw"), HttpRecorder("jobs")
    await asyncio.to_thread(infra.start)
    for server in (smtp, gateway, recorder):
        server.listen()
    reservo = Reservo(cast(Infra, infra), smtp, gateway, logs)
    reservo.env["RESERVO_REDIS_CLUSTER"] = "true"
    reservo.env["RESERVO_DB_UNAVAILABLE_HOLD_S"] = "0.5"
    client = Client(reservo.api_urls)
    w: World | None = None
    try:
        await asyncio.to_thread(reservo.migrate)
        await asyncio.to_thread(reservo.start_all)
        ledger = Ledger()
        fx = await make_fixtures(client, ledger)
        w = World(cast(Infra, infra), reservo, smtp, gateway, recorder, client, ledger, fx)
        await book_appointment(client, ledger, fx)
        results, _ = await w.drained(90)
        assert all(r.ok for r in results), _failures(results)
        client.traffic = Traffic()
        yield w
    finally:
        await client.aclose()
        if w is not None and w.db is not None:
            await w.db.close()
        await asyncio.to_thread(reservo.stop_all)
        for server in (smtp, gateway, recorder):
            server.refuse()
        await asyncio.to_thread(infra.stop)
        shutil.rmtree(data, ignore_errors=True)


def ha(w: World) -> HaInfra:
    return cast(HaInfra, w.infra)


async def writes_back_after(w: World, t0: float, bound_s: float = 60) -> float:
    """Seconds from ``t0`` (the kill) until a write through the API succeeds."""
    async with httpx.AsyncClient(timeout=5) as http:
        while time.monotonic() - t0 < bound_s:
            for url in w.reservo.api_urls:
                with contextlib.suppress(httpx.TransportError):
                    r = await http.post(
                        f"{url}/api/doctors",
                        json={"name": "Dr. Probe", "timezone": "UTC"},
                        headers=ADMIN,
                    )
                    if r.status_code == 201:
                        return time.monotonic() - t0
            await asyncio.sleep(0.1)
    pytest.fail(f"no write succeeded within {bound_s} s of the kill")


async def rejoin(w: World, names: list[str]) -> None:
    """The lost machines come back: their keepers rejoin as standbys."""
    for name in names:
        ha(w).pg.run(name)
    await asyncio.to_thread(ha(w).pg.wait_settled, 90)


async def pg_scenario(w: World, name: str, victims: list[str], what: str) -> None:
    pids = w.reservo.pids()
    timing: dict[str, float] = {}

    async def fault(w: World) -> None:
        await asyncio.sleep(3)
        for victim in victims[:-1]:  # standbys first
            await asyncio.to_thread(ha(w).pg.kill, victim)
            await asyncio.sleep(2)
        await asyncio.to_thread(ha(w).pg.kill, victims[-1])
        t0 = time.monotonic()
        timing["writes_back_s"] = await writes_back_after(w, t0)
        timing["503"] = w.client.traffic.statuses[503]
        await rejoin(w, victims)

    await scenario(w, name, what, fault)
    print(
        f"[failover] {name}: writes succeeded {timing['writes_back_s']:.1f} s after the "
        f"kill (goal {PG_GOAL_S:.0f} s); {timing['503']:.0f} answers 503 meanwhile"
    )
    report.ROWS[-1].faults += f"; writes back after {timing['writes_back_s']:.1f} s"
    assert timing["writes_back_s"] <= PG_GOAL_S
    assert w.reservo.pids() == pids and all(w.reservo.alive().values())
    await healed(w, 60)


async def test_postgres_primary_machine_lost(ha_world: World) -> None:
    primary = ha(ha_world).pg.primary()
    assert primary is not None
    await pg_scenario(
        ha_world,
        "pg primary lost",
        [primary],
        f"PostgreSQL primary {primary} SIGKILLed (keeper + server), a standby promoted",
    )


async def test_redis_master_lost(ha_world: World) -> None:
    pids = ha_world.reservo.pids()
    cluster = ha(ha_world).redis
    timing: dict[str, float] = {}
    victim = next(n for n in cluster.nodes() if n.is_master and n.port != cluster.ports[0])

    async def fault(w: World) -> None:
        await asyncio.sleep(3)
        cluster.kill(victim.port)
        t0 = time.monotonic()
        await asyncio.to_thread(cluster.wait_failover, victim.port, 30)
        timing["promoted_s"] = time.monotonic() - t0
        cluster._spawn(victim.port)  # the machine back: it rejoins as a replica
        await asyncio.to_thread(cluster.wait_ready, 30)

    await scenario(ha_world, "redis master lost", f"Redis master {victim.port} SIGKILLed", fault)
    print(f"[failover] redis: replica promoted {timing['promoted_s']:.1f} s after the kill")
    assert timing["promoted_s"] <= REDIS_GOAL_S
    assert ha_world.reservo.pids() == pids and all(ha_world.reservo.alive().values())
    await healed(ha_world, 60)


# Last: when it fails, the PostgreSQL set is left with one node. Seen here:
# with the standby of the set killed 2 s before the primary, the monitor kept the
# last node in report_lsn and promoted nothing (pg_auto_failover 2.0 waits for the
# lost standby's LSN); a lost machine in between is brought back first in the
# real world. Kept as the issue states it, expected to fail until understood.
@pytest.mark.xfail(reason="pg_auto_failover did not promote the last node", strict=False)
async def test_sync_standby_then_primary_lost(ha_world: World) -> None:
    pg = ha(ha_world).pg
    primary = pg.primary()
    assert primary is not None
    standby = next(n for n in pg.ports if n != primary)
    await pg_scenario(
        ha_world,
        "pg standby, then primary lost",
        [standby, primary],
        f"standby {standby} of the synchronous set SIGKILLed, 2 s later the primary {primary}",
    )
