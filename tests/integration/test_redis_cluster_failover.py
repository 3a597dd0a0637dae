"""reservo's Redis Cluster client when a master dies, on a cluster of the test's
own (tests/redis_cluster.py: three masters, a replica each, a 2 s node timeout).

* RESERVO_REDIS_URL names several start-up nodes (``redis://h1:p1,h2:p2/0``): a
  real ``reservo api`` whose first start-up node is dead starts, answers, and
  its Redis calls go through the others.
* A long-lived client behind the fail-open gate, pipelining without pause,
  follows the promotion of a SIGKILLed master's replica within 5 s of the kill.
"""

from __future__ import annotations

import asyncio
import time
import uuid
from datetime import date, timedelta
from pathlib import Path

import httpx
import pytest
import redis
from redis.crc import key_slot

from reservo.core.redis.client import RedisGate, make_client, pipeline, startup_nodes
from reservo.settings import Settings
from tests.helpers.appointments import book, make_slots
from tests.helpers.auth import ADMIN
from tests.helpers.procs import env_for, free_port, running, wait_http
from tests.redis_cluster import LocalCluster

pytestmark = pytest.mark.timeout(180)

NODE_TIMEOUT_MS = 2000
# The goal: calls for a dead master's slots succeed again this soon.
FOLLOW_GOAL_S = 5.0
# The request path's client and gate as deployed.
DEFAULT = {
    name: Settings.model_fields[name].default for name in ("redis_timeout_s", "redis_backoff_s")
}


def all_nodes_url(cluster: LocalCluster) -> str:
    return "redis://" + ",".join(f"127.0.0.1:{p}" for p in cluster.ports) + "/0"


def test_a_url_names_several_startup_nodes() -> None:
    url = "redis://user:secret@10.0.0.1:7001,10.0.0.2,[::1]:7003/0"
    assert startup_nodes(url) == [("10.0.0.1", 7001), ("10.0.0.2", 6379), ("::1", 7003)]
    client = make_client(url, 0.5, cluster=True)
    assert isinstance(client, redis.asyncio.RedisCluster)
    seeds = [n.name for n in client.nodes_manager.startup_nodes.values()]
    assert seeds == ["10.0.0.1:7001", "10.0.0.2:6379", "[::1]:7003"] or seeds == [
        "10.0.0.1:7001",
        "10.0.0.2:6379",
        "::1:7003",
    ]
    assert client.connection_kwargs["password"] == "secret"
    assert client.connection_kwargs["username"] == "user"
    with pytest.raises(ValueError, match="RESERVO_REDIS_CLUSTER"):
        make_client(url, 0.5, cluster=False)


async def test_the_api_starts_and_serves_while_its_first_startup_node_is_dead(
    base_settings: Settings, tmp_path: Path
) -> None:
    with LocalCluster(tmp_path / "cluster", node_timeout_ms=NODE_TIMEOUT_MS) as cluster:
        first = cluster.ports[0]
        assert any(n.port == first and n.is_master for n in cluster.nodes())
        cluster.kill(first)
        namespace = f"startup-{uuid.uuid4().hex[:8]}"
        env = env_for(
            base_settings,
            RESERVO_REDIS_URL=all_nodes_url(cluster),
            RESERVO_REDIS_CLUSTER="true",
            RESERVO_REDIS_NAMESPACE=namespace,
        )
        port, log = free_port(), tmp_path / "api.log"
        base = f"http://127.0.0.1:{port}"
        # Started at once, while the dead master's slots are not served yet.
        with running(["api", "--port", str(port)], env, log) as proc:
            await asyncio.to_thread(wait_http, f"{base}/readyz", proc, log, 60)
            await asyncio.to_thread(cluster.wait_failover, first, 30)
            async with httpx.AsyncClient(base_url=base, timeout=10) as http:
                deadline = time.monotonic() + 10
                while (await http.get("/readyz")).json()["checks"]["redis"] != "up":
                    assert time.monotonic() < deadline, log.read_text()
                    await asyncio.sleep(0.2)
                doctor, slots = await make_slots(http)
                day = (date.today() + timedelta(days=2)).isoformat()  # make_slots's day
                patient = 4242
                r = await book(http, slots[0]["id"], patient)
                assert r.status_code == 201, r.text
                appointment = r.json()["id"]
                r = await http.get(f"/api/appointments/{appointment}", headers=ADMIN)
                assert r.status_code == 200, r.text
                # Read through the slot-list cache (in Redis), twice: filled, then hit.
                for _ in range(2):
                    r = await http.get(
                        f"/api/doctors/{doctor}/slots", params={"date": day}, headers=ADMIN
                    )
                    assert r.status_code == 200, r.text
                    # The booked slot is full: the list offers the others only.
                    assert [s["id"] for s in r.json()] == [s["id"] for s in slots[1:]], r.text
            assert proc.poll() is None
        # What the process wrote in Redis, read from the live masters: its calls
        # went through the nodes other than the dead start-up one.
        written = 0
        for node in cluster.nodes():
            if node.is_master:
                with redis.Redis(port=node.port) as r:
                    written += len(list(r.scan_iter(match=f"{namespace}*", count=1000)))
        assert written > 0, log.read_text()


async def test_a_running_client_follows_a_master_failover_within_5_s(tmp_path: Path) -> None:
    with LocalCluster(tmp_path / "cluster", node_timeout_ms=NODE_TIMEOUT_MS) as cluster:
        victim = next(n for n in cluster.nodes() if n.is_master and n.port != cluster.ports[0])
        # Keys on every master, at least one on the victim's slots.
        keys = [f"{{follow-{i}}}" for i in range(64)]
        on_victim = [
            k for k in keys if any(a <= key_slot(k.encode()) <= b for a, b in victim.slots)
        ]
        assert on_victim
        client = make_client(all_nodes_url(cluster), DEFAULT["redis_timeout_s"], cluster=True)
        # The request path's gate as deployed (settings' defaults).
        gate = RedisGate(client, backoff_s=DEFAULT["redis_backoff_s"])
        probe = on_victim[0]

        async def batch(c: object) -> bool:
            assert isinstance(c, redis.asyncio.RedisCluster)
            await pipeline(c, [("INCR", k) for k in keys])
            return True

        async def probe_ok(c: object) -> bool:
            assert isinstance(c, redis.asyncio.RedisCluster)
            await pipeline(c, [("INCR", probe)])
            return True

        stop = asyncio.Event()
        timing: dict[str, float] = {}

        async def load() -> None:  # other callers, all the while
            while not stop.is_set():
                await gate.call(batch, False)
                await asyncio.sleep(0.005)

        try:
            assert await gate.call(batch, False)
            loaders = [asyncio.create_task(load()) for _ in range(4)]
            await asyncio.sleep(0.5)
            cluster.kill(victim.port)
            t0 = time.monotonic()
            promoted = asyncio.create_task(
                asyncio.to_thread(cluster.wait_failover, victim.port, 30)
            )
            promoted.add_done_callback(
                lambda _: timing.setdefault("promoted", time.monotonic() - t0)
            )
            failed = False
            back_s = None
            while time.monotonic() - t0 < 30:
                if await gate.call(probe_ok, False):
                    if failed:
                        back_s = time.monotonic() - t0
                        break
                else:
                    failed = True
                await asyncio.sleep(0.02)
            stop.set()
            await asyncio.gather(*loaders, promoted)
        finally:
            await client.aclose()
        assert failed, "the kill was never seen"
        assert back_s is not None, "calls for the dead master's slots never came back"
        print(
            f"[failover] redis client: replica promoted {timing['promoted']:.2f} s after the "
            f"kill, calls for its slots back through the gate {back_s:.2f} s after the kill"
        )
        assert back_s <= FOLLOW_GOAL_S
        assert cluster.master_of(probe).port != victim.port
