"""Partitions, not only deaths: the network between the machines is cut while
every machine stays up, under the chaos suite's mixed HTTP load.

The world is test_failover.py's (pg_auto_failover: a monitor, a primary and two
standbys in synchronous replication ``ANY 1``; a 3+3 Redis Cluster; Tansu; 2 API
and 2 ``worker --roles all`` processes), but every PostgreSQL node and the
monitor run on a host of their own in a network lab (tests/chaos/netns.py), and
each reservo process reaches PostgreSQL from a lab host through a relay
(tests/chaos/relay.py): ``api1`` from ``edge1``, the others from ``edge2``.

The partition isolates the primary, keeper included, from the monitor, both
standbys and ``edge2`` for 30 s; ``edge1`` stays on its side (it reaches the old
primary and nothing else of PostgreSQL). What must hold:

- nothing ``api1`` is asked to write while it is cut off is acknowledged: its
  commits wait for a synchronous standby that never answers (they must end in
  503, not hang and not 2xx); a commit sent straight to the isolated primary is
  not acknowledged either, and is gone once it rejoins;
- writes through the processes on the majority side succeed again within 15 s;
- after the heal the old primary rejoins as a standby with no SQL by hand;
- the checks of tests/chaos/checks.py: every acknowledged write is there once.

The second scenario cuts a Redis Cluster master off from its replica and the
other masters (every Redis node is on a lab host too) while every reservo
process still reaches it; what it takes in its last seconds must decide nothing
twice once healed (PostgreSQL is the truth). Both share one world (about 2.5
minutes in all). ``RESERVO_CHAOS_KEEP=1`` keeps the PostgreSQL data directories (with the
keepers' logs) for a post-mortem.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import shutil
import subprocess
import sys
import tempfile
import time
from collections import Counter
from collections.abc import AsyncIterator, Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import cast

import httpx
import pytest
import redis

from reservo.core.embedded import EmbeddedKafka
from tests.chaos import netns, report
from tests.chaos.fakes import HttpRecorder, SmtpRecorder
from tests.chaos.load import ADMIN, Answer, Client, Ledger, Traffic, book_appointment, make_fixtures
from tests.chaos.scenario import World, _failures, healed, scenario
from tests.chaos.stack import Infra, Reservo
from tests.chaos.verified import assert_verified
from tests.ha import DATABASE, NODES, PG_BIN, SOCKET_DIR, HaPostgres
from tests.ha import missing as ha_missing
from tests.helpers.procs import free_port
from tests.redis_cluster import LocalCluster

pytestmark = [pytest.mark.chaos, pytest.mark.partition, pytest.mark.timeout(600)]

ROOT = Path(__file__).resolve().parents[2]
PARTITION_S = 30.0
WRITES_BACK_GOAL_S = 15.0
EDGES = ("edge1", "edge2")  # where api1 / everyone else reach PostgreSQL from
REDIS_HOSTS = tuple(f"redis{i}" for i in range(1, 7))
REDIS_SPLIT_S = 10.0
# Acknowledged by something else than a PostgreSQL commit (Kafka): not a write
# the isolated primary could have taken.
NOT_A_COMMIT = ("/api/webhooks/match-results",)


@dataclass
class LabInfra:
    """What tests/chaos/stack.Reservo needs of an Infra: PostgreSQL on the lab's
    hosts, Redis and Kafka on the machine's loopback, a relay per edge host."""

    root: Path
    lab: netns.Lab
    pg: HaPostgres = field(init=False)
    redis: LocalCluster = field(init=False)
    kafka: EmbeddedKafka = field(init=False)
    relays: list[subprocess.Popen[str]] = field(default_factory=list)
    database_url: str = ""
    redis_url: str = ""
    bootstrap: str = ""

    def __post_init__(self) -> None:
        for name in ("monitor", *NODES, *EDGES, *REDIS_HOSTS):
            self.lab.add(name)
        addresses = {n: h.address for n, h in self.lab.hosts.items()}
        self.pg = HaPostgres(self.root / "pg", addresses, self.lab.command)
        self.redis = LocalCluster(
            self.root / "redis",
            node_timeout_ms=2000,
            addresses=[addresses[h] for h in REDIS_HOSTS],
            prefix=lambda port, argv: self.lab.command(self.redis_host(port), argv),
        )
        self.kafka = EmbeddedKafka(self.root, port=free_port())

    def start(self) -> None:
        try:
            self.pg.start()
            self.redis.start()
            self.bootstrap = self.kafka.start()
            for edge in EDGES:
                self._relay(edge)
        except BaseException:
            self.stop()
            raise
        self.database_url = self.pg.url
        # Every node a start-up node; reservo reaches each from the machine.
        self.redis_url = self.redis.urls

    def redis_host(self, port: int) -> str:
        """The lab host of the Redis node on ``port``."""
        return REDIS_HOSTS[self.redis.ports.index(port)]

    def _relay(self, edge: str) -> None:
        """Each node's port on ``edge``'s address, relayed to the node."""
        routes = [f"{self.pg.ports[n]}:{self.pg.addresses[n]}:{self.pg.ports[n]}" for n in NODES]
        argv = [sys.executable, "-m", "tests.chaos.relay", self.lab.hosts[edge].address, *routes]
        proc = subprocess.Popen(
            self.lab.command(edge, argv), cwd=ROOT, stdout=subprocess.PIPE, text=True
        )
        self.relays.append(proc)
        assert proc.stdout is not None and proc.stdout.readline().strip() == "relaying"

    def urls(self, edge: str) -> dict[str, str]:
        """The database settings of a process that reaches PostgreSQL from ``edge``."""
        hosts = ",".join(f"{self.lab.hosts[edge].address}:{self.pg.ports[n]}" for n in NODES)
        base = f"postgresql://postgres@{hosts}/{DATABASE}?target_session_attrs="
        return {
            "RESERVO_DATABASE_URL": base + "read-write",
            "RESERVO_DATABASE_REPLICA_URLS": base + "prefer-standby",
        }

    def stop(self) -> None:
        for relay in self.relays:
            relay.kill()
            relay.wait()
        for stop in (self.kafka.stop, self.redis.stop, self.pg.stop):
            with contextlib.suppress(Exception):
                stop()


@pytest.fixture(scope="module")
def lab() -> Iterator[netns.Lab]:
    why = netns.missing() or ha_missing()
    if why:
        pytest.skip(f"SKIPPED LOUDLY: no partition scenarios here: {why}")
    with netns.lab() as net:
        yield net


@pytest.fixture(scope="module")
async def part_world(
    lab: netns.Lab, tmp_path_factory: pytest.TempPathFactory
) -> AsyncIterator[World]:
    logs = Path(tmp_path_factory.mktemp("partition"))
    data = Path(tempfile.mkdtemp(prefix="reservo-partition-"))
    infra = LabInfra(data, lab)
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
    for name, proc in reservo.procs.items():
        proc.env = infra.urls("edge1" if name == "api1" else "edge2")
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
        if not os.environ.get("RESERVO_CHAOS_KEEP"):  # set: kept for a post-mortem
            shutil.rmtree(data, ignore_errors=True)


def infra_of(w: World) -> LabInfra:
    return cast(LabInfra, w.infra)


async def writes_back_after(url: str, t0: float, bound_s: float = 60) -> float:
    """Seconds from ``t0`` until a write through the API at ``url`` succeeds."""
    async with httpx.AsyncClient(timeout=5) as http:
        while time.monotonic() - t0 < bound_s:
            with contextlib.suppress(httpx.TransportError):
                r = await http.post(
                    f"{url}/api/doctors",
                    json={"name": "Dr. Probe", "timezone": "UTC"},
                    headers=ADMIN,
                )
                if r.status_code == 201:
                    return time.monotonic() - t0
            await asyncio.sleep(0.1)
    pytest.fail(f"no write through {url} succeeded within {bound_s} s of the partition")


def psql(pg: HaPostgres, node: str, sql: str, timeout_s: float) -> str | None:
    """``sql`` on ``node`` over TCP from the machine (which reaches every host).
    None when no answer came within ``timeout_s``: psql is then killed, which
    closes its connection and sends no cancel request."""
    url = pg.node_url(node)
    try:
        done = subprocess.run(
            [str(PG_BIN / "psql"), url, "-Atc", sql],
            capture_output=True,
            text=True,
            timeout=timeout_s,
        )
    except subprocess.TimeoutExpired:
        return None
    return done.stdout.strip() if done.returncode == 0 else f"error: {done.stderr.strip()}"


def local_sql(pg: HaPostgres, node: str, sql: str) -> str | None:
    """``sql`` on ``node`` through its Unix socket (no network: answers while the
    node is cut off); None when its PostgreSQL is not running."""
    done = subprocess.run(
        [str(PG_BIN / "psql"), "-h", SOCKET_DIR, "-p", str(pg.ports[node]), "-U", "postgres",
         "-d", DATABASE, "-Atc", sql],
        capture_output=True, text=True, timeout=10,
    )  # fmt: skip
    return done.stdout.strip() if done.returncode == 0 else None


def acknowledged_by(answers: list[Answer], url: str, since: float, until: float) -> list[str]:
    """The writes ``url`` answered 2xx that were sent within [since, until]."""
    return [
        f"{a.method} {a.path} {a.status} at +{a.sent - since:.1f} s"
        for a in answers
        if a.url == url
        and since <= a.sent <= until
        and a.method != "GET"
        and a.status is not None
        and 200 <= a.status < 300
        and not a.path.startswith(NOT_A_COMMIT)
    ]


@dataclass
class Watch:
    """What the isolated primary did, polled through its Unix socket."""

    commits_waiting: int = 0  # the most backends seen waiting for a sync standby
    fenced_s: float | None = None  # when its PostgreSQL stopped answering


async def watch_isolated(pg: HaPostgres, node: str, t0: float, stop: asyncio.Event) -> Watch:
    seen = Watch()
    sql = "SELECT count(*) FROM pg_stat_activity WHERE wait_event = 'SyncRep'"
    while not stop.is_set():
        waiting = await asyncio.to_thread(local_sql, pg, node, sql)
        if waiting is None:
            if seen.fenced_s is None:
                seen.fenced_s = time.monotonic() - t0
        else:
            seen.commits_waiting = max(seen.commits_waiting, int(waiting))
        await asyncio.sleep(0.5)
    return seen


async def test_postgres_primary_partitioned(part_world: World) -> None:
    w = part_world
    infra = infra_of(w)
    pg, lab = infra.pg, infra.lab
    old = pg.primary()
    assert old is not None
    standbys = [n for n in NODES if n != old]
    api1, api2 = w.reservo.api_urls
    pids = w.reservo.pids()
    assert psql(pg, old, "CREATE TABLE IF NOT EXISTS partition_probe (tag text)", 10) is not None
    timing: dict[str, float] = {}
    watch: list[Watch] = []

    async def fault(w: World) -> None:
        await asyncio.sleep(3)
        t0 = time.monotonic()
        lab.partition(old, ["monitor", *standbys, "edge2"])
        lab.partition("edge1", ["monitor", *standbys])
        stop = asyncio.Event()
        watcher = asyncio.create_task(watch_isolated(pg, old, t0, stop))
        # A commit straight on the isolated primary: never acknowledged.
        probe = asyncio.to_thread(
            psql, pg, old, "INSERT INTO partition_probe VALUES ('isolated')", 8
        )
        promoted = asyncio.create_task(
            until(lambda: pg.primary() not in (None, old), t0, PARTITION_S, "a promotion")
        )
        timing["writes_back_s"], probe_answer = await asyncio.gather(
            writes_back_after(api2, t0), probe
        )
        assert probe_answer is None, f"the isolated primary answered a commit: {probe_answer}"
        timing["promoted_s"] = await promoted
        await asyncio.sleep(max(0.0, t0 + PARTITION_S - time.monotonic()))
        t_heal = time.monotonic()
        lab.heal()
        stop.set()
        watch.append(await watcher)
        timing["t0"], timing["heal"] = t0, t_heal
        await asyncio.to_thread(pg.wait_settled, 120)
        timing["rejoined_s"] = time.monotonic() - t_heal

    await scenario(
        w,
        "pg primary partitioned",
        f"PostgreSQL primary {old} and its keeper cut off from the monitor, both standbys and "
        f"3 of the 4 reservo processes for {PARTITION_S:.0f} s (api1 still reaches it alone)",
        fault,
    )
    t0, t_heal = timing["t0"], timing["heal"]
    lied = acknowledged_by(w.client.traffic.answers, api1, t0, t_heal)
    cut_off = [a for a in w.client.traffic.answers if a.url == api1 and t0 <= a.sent <= t_heal]
    writes = Counter(a.status for a in cut_off if a.method != "GET")
    reads = Counter(a.status for a in cut_off if a.method == "GET")
    new = pg.primary()
    fenced = watch[0].fenced_s
    print(
        f"[partition] pg: {new} promoted {timing['promoted_s']:.1f} s after the cut, writes "
        f"back through the majority side {timing['writes_back_s']:.1f} s after it (goal "
        f"{WRITES_BACK_GOAL_S:.0f} s); {w.client.traffic.statuses[503]} answers 503 in the "
        f"scenario; api1, cut off with the old primary, answered writes {dict(writes)} and "
        f"reads {dict(reads)}; up to {watch[0].commits_waiting} commits waited for a "
        f"synchronous standby on the isolated primary, which "
        + (f"stopped itself {fenced:.1f} s after the cut" if fenced else "ran until the heal")
        + f"; {old} rejoined as a standby {timing['rejoined_s']:.1f} s after the heal"
    )
    report.ROWS[-1].faults += f"; writes back after {timing['writes_back_s']:.1f} s"
    assert not lied, f"api1 acknowledged writes the isolated primary took: {lied}"
    assert sum(writes.values()), "no write reached api1 while it was cut off: nothing proven"
    assert timing["writes_back_s"] <= WRITES_BACK_GOAL_S
    assert new is not None and new != old and pg.states()[old] == ("secondary", "secondary")
    assert psql(pg, new, "SELECT count(*) FROM partition_probe", 10) == "0"
    assert w.reservo.pids() == pids and all(w.reservo.alive().values())
    await healed(w, 60)
    assert_verified(w.infra.database_url)


def _info(cluster: LocalCluster, port: int, section: str) -> dict[str, str] | None:
    """``INFO section`` of the node on ``port`` (reached from the machine)."""
    try:
        with cluster._node(port) as r:
            r.set_response_callback("INFO", lambda response, **_: response)
            text = r.execute_command("INFO", section)
    except redis.RedisError:
        return None
    return dict(line.split(":", 1) for line in text.split() if ":" in line)


def _cluster_state(cluster: LocalCluster, port: int) -> str | None:
    try:
        with cluster._node(port) as r:
            r.set_response_callback("CLUSTER INFO", lambda response, **_: response)
            text = r.execute_command("CLUSTER INFO")
    except redis.RedisError:
        return None
    return dict(line.split(":", 1) for line in text.split() if ":" in line).get("cluster_state")


async def until(ok: Callable[[], bool], t0: float, bound_s: float, what: str) -> float:
    """Seconds from ``t0`` until ``ok()`` (polled in a thread: it blocks)."""
    while not await asyncio.to_thread(ok):
        if time.monotonic() - t0 > bound_s:
            pytest.fail(f"{what}: not within {bound_s} s")
        await asyncio.sleep(0.1)
    return time.monotonic() - t0


async def test_redis_master_split_from_the_majority(part_world: World) -> None:
    """A Redis Cluster master cut off from its replica and the other masters, while
    every reservo process still reaches it (the machine is on both sides): it
    takes writes until it sees it lost the majority (cluster-node-timeout), the
    majority promotes its replica, and at the heal it becomes a replica and
    drops what it took meanwhile. PostgreSQL is the truth: no booking, job or
    payment decided twice, none lost."""
    w = part_world
    infra = infra_of(w)
    cluster, lab = infra.redis, infra.lab
    pids = w.reservo.pids()
    victim = next(n for n in cluster.nodes() if n.is_master)
    replica = next(n for n in cluster.nodes() if n.master_id == victim.node_id)
    majority = next(p for p in cluster.ports if p not in (victim.port, replica.port))
    timing: dict[str, float] = {}

    def promoted() -> bool:
        view = {n.port: n for n in cluster.nodes(via=majority)}
        return "fail" in view[victim.port].flags and view[replica.port].is_master

    async def fault(w: World) -> None:
        await asyncio.sleep(3)
        offset = int((_info(cluster, victim.port, "replication") or {})["master_repl_offset"])
        t0 = time.monotonic()
        others = [infra.redis_host(p) for p in cluster.ports if p != victim.port]
        lab.partition(infra.redis_host(victim.port), others)
        timing["refusing_s"] = await until(
            lambda: _cluster_state(cluster, victim.port) == "fail", t0, 30, "the cut-off master"
        )
        after = int((_info(cluster, victim.port, "replication") or {})["master_repl_offset"])
        timing["unreplicated_bytes"] = after - offset
        timing["promoted_s"] = await until(promoted, t0, 30, "the replica's promotion")
        await asyncio.sleep(max(0.0, t0 + REDIS_SPLIT_S - time.monotonic()))
        t_heal = time.monotonic()
        lab.heal()
        await asyncio.to_thread(cluster.wait_ready, 60)
        timing["rejoined_s"] = time.monotonic() - t_heal

    await scenario(
        w,
        "redis master split",
        f"Redis master {victim.port} cut off from its replica and the other masters for "
        f"{REDIS_SPLIT_S:.0f} s; every reservo process still reaches it",
        fault,
    )
    role = next(n for n in cluster.nodes() if n.port == victim.port)
    print(
        f"[partition] redis: the cut-off master took writes for {timing['refusing_s']:.1f} s "
        f"({timing['unreplicated_bytes']:.0f} bytes of replication stream no replica got), "
        f"then answered CLUSTERDOWN; its replica was promoted {timing['promoted_s']:.1f} s "
        f"after the cut; at the heal it rejoined as {sorted(role.flags)} in "
        f"{timing['rejoined_s']:.1f} s"
    )
    assert "slave" in role.flags, role
    assert w.reservo.pids() == pids and all(w.reservo.alive().values())
    await healed(w, 60)
    assert_verified(w.infra.database_url)
