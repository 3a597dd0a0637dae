"""The topology that loses a machine and nothing else, on one machine: a PostgreSQL
primary and two standbys in synchronous replication (``ANY 1``: an acknowledged
commit is on at least one standby) under pg_auto_failover (a monitor and one
``pg_autoctl`` keeper per node), and a Redis Cluster of three masters with a
replica each (tests/redis_cluster.py). Separate data directories and ports,
loopback only. The failover test (tests/chaos/test_failover.py) and a developer
(scripts/ha.sh, which runs ``python -m tests.ha``) start the same thing.

pg_auto_failover comes from Debian (``postgresql-15-auto-failover``, installed by
scripts/ha.sh); PostgreSQL refuses root, so when we are root every keeper runs as
the ``postgres`` user (``nobody`` if there is none). The monitor is tuned to
notice a dead node in about 2 s and to promote after a 3 s demote timeout (the
defaults add up to about 50 s): see docs/SCALING.md for what that trades.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import pwd
import shutil
import signal
import stat
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from pathlib import Path

import psutil

from tests.helpers.procs import free_port
from tests.redis_cluster import LocalCluster

PG_BIN = Path(os.environ.get("RESERVO_HA_PG_BIN", "/usr/lib/postgresql/15/bin"))
NODES = ("node1", "node2", "node3")
DATABASE = "reservo"
# How fast the monitor decides (ms): a health check a second, one retry, a node
# silent for 2 s is unhealthy, and a primary that does not confirm its demotion
# within 3 s is taken as dead (the promotion waits that long: the fencing delay).
MONITOR_SETTINGS = {
    "pgautofailover.health_check_period": 1000,
    "pgautofailover.health_check_timeout": 1000,
    "pgautofailover.health_check_max_retries": 1,
    "pgautofailover.health_check_retry_delay": 500,
    "pgautofailover.node_considered_unhealthy_timeout": 2000,
    "pgautofailover.primary_demote_timeout": 3000,
}
# Where PostgreSQL (Debian's build) puts its Unix sockets, one per port.
SOCKET_DIR = "/var/run/postgresql"
SETTLED = {"primary", "secondary", "single"}
WRITABLE = {"primary", "wait_primary", "single"}


def missing() -> str | None:
    """Why the HA PostgreSQL set cannot run here, or None."""
    if shutil.which("pg_autoctl") is None:
        return "pg_autoctl not found (scripts/ha.sh install: postgresql-15-auto-failover)"
    if not (PG_BIN / "pg_ctl").exists():
        return f"no PostgreSQL binaries in {PG_BIN} (RESERVO_HA_PG_BIN)"
    return None


def _run_user() -> pwd.struct_passwd | None:
    if os.geteuid() != 0:
        return None
    for name in ("postgres", "nobody"):
        with contextlib.suppress(KeyError):
            return pwd.getpwnam(name)
    raise RuntimeError("running as root and neither user postgres nor nobody exists")


def kill_tree(pid: int, sig: signal.Signals = signal.SIGKILL) -> list[psutil.Process]:
    """``sig`` to ``pid`` and every process under it, all at once (a machine that
    dies says goodbye to nobody). Returns the processes signalled."""
    try:
        top = psutil.Process(pid)
        everyone = [top, *top.children(recursive=True)]
    except psutil.NoSuchProcess:
        return []
    for proc in everyone:
        with contextlib.suppress(psutil.NoSuchProcess):
            proc.send_signal(sig)
    return everyone


def wait_gone(procs: list[psutil.Process], timeout_s: float) -> bool:
    _, alive = psutil.wait_procs(procs, timeout=timeout_s)
    return not [p for p in alive if p.status() != psutil.STATUS_ZOMBIE]


Prefix = Callable[[str, Sequence[str]], list[str]]


def _no_prefix(_name: str, argv: Sequence[str]) -> list[str]:
    return list(argv)


class HaPostgres:
    """A monitor and three nodes under ``root``; ``url`` names all three.

    By default every node listens on loopback. ``addresses`` (node name or
    ``"monitor"`` -> IPv4) and ``prefix`` (``netns.Lab.command``: how a node's
    processes are started on its own host) put each node on a host of a network
    lab (tests/chaos/netns.py), where the network between them can be cut; the
    pg_hba rules then let the lab's subnet in (``--pg-hba-lan``)."""

    def __init__(
        self,
        root: Path,
        addresses: dict[str, str] | None = None,
        prefix: Prefix = _no_prefix,
    ) -> None:
        self.root = root
        self.user = _run_user()
        self.addresses = {n: "127.0.0.1" for n in ("monitor", *NODES)} | (addresses or {})
        self.prefix = prefix
        self.lan = addresses is not None
        self.monitor_port = free_port()
        self.ports = {name: free_port() for name in NODES}
        self.procs: dict[str, subprocess.Popen[bytes]] = {}

    def hosts(self, names: Sequence[str] = NODES) -> str:
        """``host:port,...`` of ``names``, for a multi-host URL."""
        return ",".join(f"{self.addresses[n]}:{self.ports[n]}" for n in names)

    @property
    def url(self) -> str:
        """What reservo is given: the node taking writes, whichever it is."""
        return f"postgresql://postgres@{self.hosts()}/{DATABASE}?target_session_attrs=read-write"

    def node_url(self, name: str) -> str:
        return f"postgresql://postgres@{self.hosts([name])}/{DATABASE}"

    @property
    def read_url(self) -> str:
        """For the stale reads (RESERVO_DATABASE_REPLICA_URLS): the same three
        hosts, a standby preferred, the primary when no standby answers."""
        return (
            f"postgresql://postgres@{self.hosts()}/{DATABASE}?target_session_attrs=prefer-standby"
        )

    @property
    def monitor_url(self) -> str:
        return (
            f"postgres://autoctl_node@{self.addresses['monitor']}:{self.monitor_port}"
            "/pg_auto_failover?sslmode=disable"
        )

    # -- processes -----------------------------------------------------------------
    def _own(self, directory: Path) -> None:
        directory.mkdir(parents=True, exist_ok=True)
        for d in [directory, *directory.parents]:
            if d == Path(tempfile.gettempdir()) or d == Path("/"):
                break
            d.chmod(d.stat().st_mode | stat.S_IXOTH)
        if self.user is not None:
            os.chown(directory, self.user.pw_uid, self.user.pw_gid)

    def _pgdata(self, name: str) -> Path:
        return self.root / name / "pgdata"

    def _autoctl(self, name: str, *args: str) -> list[str]:
        home = self.root / name
        env = [
            f"HOME={home}",
            f"XDG_CONFIG_HOME={home}/config",
            f"XDG_DATA_HOME={home}/share",
            f"XDG_RUNTIME_DIR={home}/run",
            f"PATH={PG_BIN}:{os.environ.get('PATH', '')}",
            f"PG_CONFIG={PG_BIN / 'pg_config'}",
        ]
        user = [] if self.user is None else ["runuser", "-u", self.user.pw_name, "--"]
        return self.prefix(name, [*user, "env", *env, "pg_autoctl", *args])

    def _spawn(self, name: str, args: list[str]) -> None:
        log = (self.root / f"{name}.log").open("ab")
        self.procs[name] = subprocess.Popen(
            args, stdout=log, stderr=subprocess.STDOUT, start_new_session=True
        )

    def _common(self, name: str, port: int) -> list[str]:
        # fmt: off
        return [
            "--pgdata", str(self._pgdata(name)), "--pgport", str(port),
            "--hostname", self.addresses[name], "--auth", "trust", "--no-ssl",
            "--pgctl", str(PG_BIN / "pg_ctl"),
        ]
        # fmt: on

    def start(self, timeout_s: float = 120) -> None:
        deadline = time.monotonic() + timeout_s
        self._own(self.root)
        self._own(self.root / "monitor")
        self._spawn(
            "monitor",
            self._autoctl(
                "monitor", "create", "monitor", *self._common("monitor", self.monitor_port), "--run"
            ),
        )
        self._until(lambda: self._monitor_sql("SELECT 1") == "1", deadline, "monitor")
        self._tune_monitor()
        for name in NODES:
            self._own(self.root / name)
            # fmt: off
            self._spawn(name, self._autoctl(
                name, "create", "postgres", *self._common(name, self.ports[name]),
                "--listen", self.addresses[name], "--name", name, "--dbname", DATABASE,
                "--monitor", self.monitor_url, *(["--pg-hba-lan"] if self.lan else []), "--run",
            ))
            # fmt: on
            self._until(lambda n=name: self._settled(n), deadline, name)  # type: ignore[misc]
            if name == NODES[0]:
                self._quick_checkpoints(name)
        self.wait_settled(max(1.0, deadline - time.monotonic()))

    def run(self, name: str) -> None:
        """Start a node's keeper again (after a kill): it rejoins as a standby of
        whichever node is primary now (pg_rewind, else a new base backup)."""
        self._spawn(name, self._autoctl(name, "run", "--pgdata", str(self._pgdata(name))))

    def kill(self, name: str) -> None:
        """The node's machine dies: its keeper and its PostgreSQL, SIGKILL."""
        procs = kill_tree(self.procs[name].pid)
        assert wait_gone(procs, 10), f"{name} outlived SIGKILL"
        self.procs[name].wait(10)

    def stop(self) -> None:
        """SIGTERM every keeper (each stops its PostgreSQL), the monitor last."""
        order = [n for n in self.procs if n != "monitor"] + ["monitor"]
        for name in order:
            proc = self.procs.get(name)
            if proc is None or proc.poll() is not None:
                continue
            procs = kill_tree(proc.pid, signal.SIGTERM)
            if not wait_gone(procs, 30):
                kill_tree(proc.pid)
            with contextlib.suppress(subprocess.TimeoutExpired):
                proc.wait(10)

    def pids(self) -> dict[str, int]:
        return {n: p.pid for n, p in self.procs.items() if p.poll() is None}

    # -- what the monitor says -------------------------------------------------------
    def _monitor_sql(self, sql: str) -> str | None:
        user = "postgres" if self.user is None else self.user.pw_name
        return self._sql("monitor", "pg_auto_failover", sql, user)

    def _sql(
        self, name: str, database: str, sql: str, user: str = "postgres", timeout_s: float = 10
    ) -> str | None:
        """``sql`` on ``name`` (a node or the monitor). On a lab, through its Unix
        socket: no network between, so it answers under any partition (and the
        pg_hba rules pg_autoctl writes let no TCP from the machine in but to
        ``reservo``)."""
        port = self.monitor_port if name == "monitor" else self.ports[name]
        try:
            out = subprocess.run(
                [
                    str(PG_BIN / "psql"),
                    "-h",
                    SOCKET_DIR if self.lan else "127.0.0.1",
                    "-p",
                    str(port),
                    "-U",
                    user,
                    "-d",
                    database,
                    "-Atc",
                    sql,
                ],
                capture_output=True,
                timeout=timeout_s,
                check=True,
                text=True,
            )
        except (subprocess.CalledProcessError, subprocess.TimeoutExpired):
            return None  # not up yet: the callers poll
        return out.stdout.strip()

    def _quick_checkpoints(self, name: str) -> None:
        """A joining standby's base backup waits for a checkpoint on the primary,
        which PostgreSQL spreads over minutes by default (pg_autoctl does not ask
        for a fast one): written at full speed instead. Set on the first node,
        the others inherit it with the base backup."""
        assert (
            self._sql(name, DATABASE, "ALTER SYSTEM SET checkpoint_completion_target = 0")
            is not None
        )
        assert self._sql(name, DATABASE, "SELECT pg_reload_conf()") == "t"

    def _tune_monitor(self) -> None:
        for name, value in MONITOR_SETTINGS.items():
            assert self._monitor_sql(f"ALTER SYSTEM SET {name} = {value}") is not None
        assert self._monitor_sql("SELECT pg_reload_conf()") == "t"

    def states(self) -> dict[str, tuple[str, str]]:
        """Each node's (reported, assigned) state, as the monitor has them."""
        text = self._monitor_sql(
            "SELECT nodename, reportedstate, goalstate FROM pgautofailover.node ORDER BY nodeid"
        )
        rows = [line.split("|") for line in (text or "").splitlines() if line]
        return {r[0]: (r[1], r[2]) for r in rows}

    def primary(self) -> str | None:
        """The node that takes writes now (reported and assigned), if any."""
        for name, (reported, goal) in self.states().items():
            if reported == goal and reported in WRITABLE:
                return name
        return None

    def wait_unhealthy(self, name: str, timeout_s: float) -> float:
        """Until the monitor has acted on ``name``'s loss: marked it unhealthy
        (no health check answered for node_considered_unhealthy_timeout) and taken
        it out of the secondaries (goal ``catchingup``). The ``health`` column
        alone turns 0 at the first failed check, before the monitor decides.
        Returns the seconds waited."""
        t0 = time.monotonic()
        self._until(
            lambda: self.states().get(name, ("", ""))[1] == "catchingup",
            t0 + timeout_s,
            f"{name} marked unhealthy",
        )
        return time.monotonic() - t0

    def leave_quorum(self, name: str, timeout_s: float) -> None:
        """What an operator (or their automation) does once a standby is lost for
        good: the formation asks for no synchronous standby count, and the lost
        node stops counting in the replication quorum; the primary then
        replicates synchronously to the standbys left (``ANY 1 (the others)``).
        Without it the monitor would wait, at the primary's loss, for the lost
        node's LSN (it may hold a commit the others lack) and promote nothing."""
        deadline = time.monotonic() + timeout_s
        self._monitor_call(
            "SELECT pgautofailover.set_formation_number_sync_standbys('default', 0)", deadline
        )
        self._until(self._primary_settled, deadline, "number_sync_standbys 0 applied")
        self._monitor_call(
            f"SELECT pgautofailover.set_node_replication_quorum('default', '{name}', false)",
            deadline,
        )
        tag = f"pgautofailover_standby_{name.removeprefix('node')}"
        self._until(
            lambda: self._primary_settled() and tag not in (self.sync_names() or tag),
            deadline,
            f"{name} out of synchronous_standby_names",
        )

    def rejoin_quorum(self, name: str, timeout_s: float) -> None:
        """Undo ``leave_quorum`` once ``name`` is back as a standby."""
        deadline = time.monotonic() + timeout_s
        self._monitor_call(
            f"SELECT pgautofailover.set_node_replication_quorum('default', '{name}', true)",
            deadline,
        )
        self._until(self._primary_settled, deadline, f"{name} back in the quorum")
        self._monitor_call(
            "SELECT pgautofailover.set_formation_number_sync_standbys('default', 1)", deadline
        )
        self.wait_settled(max(1.0, deadline - time.monotonic()))

    def sync_names(self) -> str | None:
        """The primary's synchronous_standby_names, as it runs now."""
        primary = self.primary()
        if primary is None:
            return None
        return self._sql(primary, DATABASE, "SHOW synchronous_standby_names")

    def _primary_settled(self) -> bool:
        primary = self.primary()
        return primary is not None and self.states()[primary] == ("primary", "primary")

    def _monitor_call(self, sql: str, deadline: float) -> None:
        """A monitor function that edits the formation: retried, since it can
        deadlock with the keepers' concurrent reports (seen here)."""
        self._until(lambda: self._monitor_sql(sql) == "t", deadline, sql)

    def _settled(self, name: str) -> bool:
        reported, goal = self.states().get(name, ("", "-"))
        return reported == goal and reported in SETTLED

    def wait_settled(self, timeout_s: float) -> None:
        """Every running node back in primary/secondary, synchronous replication on."""
        live = [n for n in NODES if n in self.procs and self.procs[n].poll() is None]
        self._until(
            lambda: all(self._settled(n) for n in live) and self.primary() is not None,
            time.monotonic() + timeout_s,
            f"settled {live}",
        )

    def _until(self, ok: object, deadline: float, what: str) -> None:
        assert callable(ok)
        while not ok():
            if time.monotonic() > deadline:
                raise RuntimeError(f"HA PostgreSQL: {what} not ready: {self.states()}")
            time.sleep(0.2)


# -- scripts/ha.sh ----------------------------------------------------------------------
def _start(root: Path) -> None:
    root.mkdir(parents=True, exist_ok=True)
    pg = HaPostgres(root / "postgres")
    redis = LocalCluster(root / "redis", node_timeout_ms=2000)
    try:  # both or neither: a half-started pair would outlive the failed command
        pg.start()
        redis.start()
    except BaseException:
        redis.stop()
        pg.stop()
        raise
    state = {
        "database_url": pg.url,
        "database_replica_urls": pg.read_url,
        "redis_url": "redis://" + ",".join(f"127.0.0.1:{p}" for p in redis.ports) + "/0",
        "pids": {
            **{f"pg-{n}": p for n, p in pg.pids().items()},
            **{f"redis-{port}": proc.pid for port, proc in redis.procs.items()},
        },
    }
    (root / "ha.json").write_text(json.dumps(state, indent=2))
    env = (
        f"export RESERVO_DATABASE_URL='{state['database_url']}'\n"
        f"export RESERVO_DATABASE_REPLICA_URLS='{state['database_replica_urls']}'\n"
        f"export RESERVO_REDIS_URL='{state['redis_url']}'\n"
        "export RESERVO_REDIS_CLUSTER=true\n"
    )
    (root / "ha.env").write_text(env)
    print(env, end="")
    print(f"# monitor: {pg.monitor_url}\n# stop: scripts/ha.sh stop {root}")


def _stop(root: Path) -> None:
    state = json.loads((root / "ha.json").read_text())
    pids: dict[str, int] = state["pids"]
    # Keepers first (each stops its PostgreSQL), the monitor last, Redis any time.
    order = sorted(pids, key=lambda n: n == "pg-monitor")
    for name in order:
        procs = kill_tree(pids[name], signal.SIGTERM)
        if not wait_gone(procs, 30):
            kill_tree(pids[name])
    print(f"stopped {len(pids)} processes; data kept in {root}")


def main(argv: list[str]) -> None:
    parser = argparse.ArgumentParser(prog="scripts/ha.sh")
    parser.add_argument("command", choices=["start", "stop"])
    parser.add_argument("dir", type=Path)
    args = parser.parse_args(argv)
    if args.command == "start":
        if why := missing():
            sys.exit(why)
        _start(args.dir.resolve())
    else:
        _stop(args.dir.resolve())


if __name__ == "__main__":
    main(sys.argv[1:])
