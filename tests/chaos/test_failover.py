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
from datetime import date, timedelta
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
PROBE_DAYS = 400  # reads_back_after reads each of these days once (a cache miss)


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
        """All three, or none: a part that fails to start stops the ones already
        up (a CI run once left a PostgreSQL cluster loading the rest of the suite)."""
        try:
            self.pg.start()
            self.redis.start()
            self.bootstrap = self.kafka.start()
        except BaseException:
            self.stop()
            raise
        self.database_url = self.pg.url
        # Every node a start-up node: the client starts while any one answers.
        self.redis_url = "redis://" + ",".join(f"127.0.0.1:{p}" for p in self.redis.ports) + "/0"

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
    try:
        await asyncio.to_thread(infra.start)
    except BaseException:
        shutil.rmtree(data, ignore_errors=True)
        raise
    for server in (smtp, gateway, recorder):
        server.listen()
    reservo = Reservo(cast(Infra, infra), smtp, gateway, logs)
    reservo.env["RESERVO_REDIS_CLUSTER"] = "true"
    reservo.env["RESERVO_DB_UNAVAILABLE_HOLD_S"] = "0.5"
    # The stale reads on whichever standby answers (the primary when none does).
    reservo.env["RESERVO_DATABASE_REPLICA_URLS"] = infra.pg.read_url
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


async def probe_doctor(w: World) -> int:
    """A doctor for reads_back_after, with slots the coming days."""
    first = date.today() + timedelta(days=1)
    async with httpx.AsyncClient(base_url=w.reservo.api_urls[0], timeout=10) as http:
        r = await http.post(
            "/api/doctors", json={"name": "Dr. Reads", "timezone": "UTC"}, headers=ADMIN
        )
        assert r.status_code == 201, r.text
        doctor = int(r.json()["id"])
        r = await http.post(
            f"/api/doctors/{doctor}/schedules",
            headers=ADMIN,
            json={
                "from": first.isoformat(),
                "to": (first + timedelta(days=12)).isoformat(),  # within the horizon
                "weekdays": list(range(1, 8)),
                "startTime": "08:00",
                "endTime": "09:00",
                "slotMinutes": 30,
                "capacity": 1,
            },
        )
        assert r.status_code == 201, r.text
    return doctor


async def reads_back_after(w: World, doctor: int, t0: float, bound_s: float = 30) -> float:
    """Seconds from ``t0`` until a slot list (a stale read: a standby preferred)
    answers 200 through the API. Each try asks for a day not read before, so the
    answer comes from PostgreSQL, not from the slot-list cache in Redis."""
    days = (date.today() + timedelta(days=1 + i) for i in range(PROBE_DAYS))
    async with httpx.AsyncClient(timeout=5) as http:
        for day in days:
            if time.monotonic() - t0 > bound_s:
                break
            url = w.reservo.api_urls[day.toordinal() % len(w.reservo.api_urls)]
            with contextlib.suppress(httpx.TransportError):
                r = await http.get(
                    f"{url}/api/doctors/{doctor}/slots",
                    params={"date": day.isoformat()},
                    headers=ADMIN,
                )
                if r.status_code == 200:
                    assert isinstance(r.json(), list), r.text
                    return time.monotonic() - t0
            await asyncio.sleep(0.1)
    pytest.fail(f"no slot list answered within {bound_s} s of the kill")


async def rejoin(w: World, names: list[str]) -> None:
    """The lost machines come back: their keepers rejoin as standbys."""
    for name in names:
        ha(w).pg.run(name)
    await asyncio.to_thread(ha(w).pg.wait_settled, 90)


async def pg_scenario(w: World, name: str, victims: list[str], what: str) -> None:
    pids = w.reservo.pids()
    timing: dict[str, float] = {}

    doctor = await probe_doctor(w)

    async def fault(w: World) -> None:
        await asyncio.sleep(3)
        for victim in victims[:-1]:  # standbys first
            t_lost = time.monotonic()
            await asyncio.to_thread(ha(w).pg.kill, victim)
            # The monitor notices, and the operator takes the lost standby out of
            # the quorum before the next loss: see test_sync_standby_then_primary_lost.
            await asyncio.to_thread(ha(w).pg.wait_unhealthy, victim, 30)
            timing["unhealthy_s"] = time.monotonic() - t_lost
            await asyncio.to_thread(ha(w).pg.leave_quorum, victim, 60)
            timing["out_of_quorum_s"] = time.monotonic() - t_lost
        await asyncio.to_thread(ha(w).pg.kill, victims[-1])
        t0 = time.monotonic()
        timing["writes_back_s"] = await writes_back_after(w, t0)
        timing["503"] = w.client.traffic.statuses[503]
        timing["reads_back_s"] = await reads_back_after(w, doctor, t0)
        await rejoin(w, victims)
        for victim in victims[:-1]:
            await asyncio.to_thread(ha(w).pg.rejoin_quorum, victim, 60)

    await scenario(w, name, what, fault)
    print(
        f"[failover] {name}: writes succeeded {timing['writes_back_s']:.1f} s after the "
        f"kill (goal {PG_GOAL_S:.0f} s); {timing['503']:.0f} answers 503 meanwhile; "
        f"slot lists (stale reads) answered {timing['reads_back_s']:.1f} s after the kill"
        + (
            f"; the lost standby marked unhealthy {timing['unhealthy_s']:.1f} s and out of the "
            f"quorum {timing['out_of_quorum_s']:.1f} s after its kill"
            if "unhealthy_s" in timing
            else ""
        )
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
    # The first start-up node too may die: every node is a start-up node.
    victim = next(n for n in cluster.nodes() if n.is_master)

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


# Last: when it fails, the PostgreSQL set is left with one node. With ANY 1 of two
# standbys, a commit acknowledged by the lost standby alone may be missing from
# the other, so when the primary dies pg_auto_failover waits for the LSN of every
# standby in the replication quorum, the dead one included: seen here, with the
# primary killed 2 s after the standby (and again once the monitor had marked the
# standby unhealthy), the last node stayed in report_lsn and nothing was promoted.
# What an operator does on losing a standby for good (tests/ha.py, leave_quorum):
# number_sync_standbys 0 and the lost node out of the quorum; the primary then
# replicates synchronously to the standby left alone, so that standby has every
# acknowledged commit, the monitor no longer waits for the dead one, and the
# primary's loss promotes it.
async def test_sync_standby_then_primary_lost(ha_world: World) -> None:
    pg = ha(ha_world).pg
    primary = pg.primary()
    assert primary is not None
    standby = next(n for n in pg.ports if n != primary)
    await pg_scenario(
        ha_world,
        "pg standby, then primary lost",
        [standby, primary],
        f"standby {standby} of the synchronous set SIGKILLed and taken out of the quorum, "
        f"then the primary {primary}",
    )
