"""Shared plumbing of the benchmarks: the 1.1 M-slot data set, the reservo processes
under test, wrk, RSS sampling, py-spy and the figures table.

Every benchmark runs against real processes (`reservo api`, `reservo worker`) on
the machine's PostgreSQL and Redis, in a dedicated database and Redis namespace,
so nothing here can touch another run's data.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import itertools
import json
import os
import platform
import re
import resource
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import urllib.error
import urllib.request
from collections import Counter
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from datetime import UTC, date, datetime, timedelta
from pathlib import Path
from typing import Any

import asyncpg
import psutil
import redis

from reservo.core.db.migrate import migrate
from reservo.core.http.auth import mint_token

BENCH_DIR = Path(__file__).resolve().parent
BIN = Path(sys.executable).parent
PG_ADMIN_URL = os.environ.get("BENCH_PG_URL", "postgresql://postgres@127.0.0.1:5432/postgres")
DB_NAME = os.environ.get("BENCH_DB", "reservo_bench")
REDIS_URL = os.environ.get("BENCH_REDIS_URL", "redis://127.0.0.1:6379/0")
# Runs of different benchmarks on one shared Redis keep apart by namespace (each
# run clears its own keys).
NAMESPACE = os.environ.get("BENCH_REDIS_NAMESPACE", "bench")
JWT_SECRET = "bench-secret-not-for-production-0123456789"
PAY_SECRET = "bench-payments-secret-not-for-production-0123456789"
RESULTS_SECRET = "bench-results-secret-not-for-production-0123456789"
# Every secret a reservo process refuses to start without (settings.SECRETS).
SECRET_SETTINGS = {
    "jwt_secret": JWT_SECRET,
    "payments_webhook_secret": PAY_SECRET,
    "results_webhook_secret": RESULTS_SECRET,
}
SECRETS_ENV = {f"RESERVO_{name.upper()}": value for name, value in SECRET_SETTINGS.items()}
# A few time zones, so slot expansion and day bounds are not all UTC.
ZONES = ("Europe/Paris", "America/New_York", "Asia/Ho_Chi_Minh", "UTC")


def db_url(name: str = DB_NAME) -> str:
    base = PG_ADMIN_URL.rsplit("/", 1)[0]
    return f"{base}/{name}"


# --- the data set -------------------------------------------------------------


@dataclass(frozen=True)
class Dataset:
    doctors: int
    days: int
    per_day: int
    first_day: date
    slots: int
    loaded_in_s: float  # 0 when an existing load was reused

    @property
    def last_day(self) -> date:
        return self.first_day + timedelta(days=self.days - 1)


_META = """
CREATE TABLE IF NOT EXISTS bench_meta (
    doctors int NOT NULL, days int NOT NULL, per_day int NOT NULL,
    first_day date NOT NULL, slots bigint NOT NULL
)"""

# One statement per table: doctors, then every (doctor, day, n) slot expanded in
# the doctor's local time (08:00 + n * 15 min) and converted to UTC by PostgreSQL.
_LOAD_DOCTORS = """
INSERT INTO doctor (name, timezone, specialty)
SELECT 'Doctor ' || g, ($2::text[])[1 + g % array_length($2::text[], 1)], 'bench'
  FROM generate_series(1, $1) AS g
"""
_OPEN_SINCE = """,
       '2000-01-01'::timestamptz  -- every slot open: the booking window is not measured here"""
_HAS_OPENS_AT = """
SELECT EXISTS (SELECT 1 FROM pg_attribute
                WHERE attrelid = 'time_slot'::regclass AND attname = 'opens_at')"""
_LOAD_SLOTS = (
    """
INSERT INTO time_slot (doctor_id, start_at, end_at, capacity, opens_at)
SELECT d.id,
       ((day + time '08:00') + n * interval '15 minutes') AT TIME ZONE d.timezone,
       ((day + time '08:00') + (n + 1) * interval '15 minutes') AT TIME ZONE d.timezone,
       1"""
    + _OPEN_SINCE
    + """
  FROM doctor d
 CROSS JOIN generate_series($1::date, $2::date, interval '1 day') AS g(ts)
 CROSS JOIN LATERAL (SELECT g.ts::date AS day) AS d2
 CROSS JOIN generate_series(0, $3 - 1) AS n
 ORDER BY d.id, d2.day, n
"""
)
_TRANSIENT = (
    "appointment",
    "appointment_payment",
    "waitlist_entry",
    "idempotency_key",
    "outbox",
    "inbox",
    "notification",
)


async def _existing(conn: asyncpg.Connection, tables: Sequence[str]) -> str:
    """Those of ``tables`` the schema has, for TRUNCATE: an older version's code
    (the "before" of a before/after pair) may predate some of them."""
    have = await conn.fetch(
        "SELECT t FROM unnest($1::text[]) t WHERE to_regclass(t) IS NOT NULL", tables
    )
    return ", ".join(r["t"] for r in have)


async def connect(url: str | None = None) -> asyncpg.Connection:
    """A connection, waiting (up to a minute) while the shared server is full."""
    for _ in range(120):
        try:
            return await asyncpg.connect(url or db_url())
        except asyncpg.TooManyConnectionsError:
            await asyncio.sleep(0.5)
    return await asyncpg.connect(url or db_url())


async def _ensure_database() -> None:
    admin = await connect(PG_ADMIN_URL)
    try:
        exists = await admin.fetchval("SELECT 1 FROM pg_database WHERE datname = $1", DB_NAME)
        if not exists:
            await admin.execute(f'CREATE DATABASE "{DB_NAME}"')
    finally:
        await admin.close()
    await migrate(db_url())


async def ensure_dataset(doctors: int, days: int, per_day: int, fresh: bool) -> Dataset:
    """Reuse a matching load whose first day is still in the future, else (re)load."""
    await _ensure_database()
    conn = await connect()
    try:
        await conn.execute(_META)
        meta = await conn.fetchrow("SELECT * FROM bench_meta")
        tomorrow = datetime.now(UTC).date() + timedelta(days=1)
        if (
            not fresh
            and meta is not None
            and (meta["doctors"], meta["days"], meta["per_day"]) == (doctors, days, per_day)
            and meta["first_day"] >= tomorrow
            and meta["slots"] == await conn.fetchval("SELECT count(*) FROM time_slot")
        ):
            return Dataset(doctors, days, per_day, meta["first_day"], meta["slots"], 0.0)
        started = time.perf_counter()
        tables = await _existing(
            conn, (*_TRANSIENT, "time_slot", "doctor_schedule", "doctor", "bench_meta")
        )
        await conn.execute(f"TRUNCATE {tables} RESTART IDENTITY")
        await conn.execute(_LOAD_DOCTORS, doctors, list(ZONES))
        last = tomorrow + timedelta(days=days - 1)
        load = _LOAD_SLOTS
        if not await conn.fetchval(_HAS_OPENS_AT):  # code older than the booking window
            load = load.replace(", opens_at)", ")").replace(_OPEN_SINCE, "")
        status = await conn.execute(load, tomorrow, last, per_day)
        slots = int(status.split()[-1])
        await conn.execute(
            "INSERT INTO bench_meta VALUES ($1, $2, $3, $4, $5)",
            doctors,
            days,
            per_day,
            tomorrow,
            slots,
        )
        await conn.execute("VACUUM ANALYZE time_slot")
        await conn.execute("VACUUM ANALYZE doctor")
        return Dataset(doctors, days, per_day, tomorrow, slots, time.perf_counter() - started)
    finally:
        await conn.close()


async def drop_database() -> None:
    admin = await connect(PG_ADMIN_URL)
    try:
        await admin.execute(f'DROP DATABASE IF EXISTS "{DB_NAME}" WITH (FORCE)')
    finally:
        await admin.close()


async def reset_state(conn: asyncpg.Connection) -> None:
    """Forget every booking, key and event of earlier runs (the slots stay)."""
    await conn.execute(f"TRUNCATE {await _existing(conn, _TRANSIENT)}")
    await conn.execute("UPDATE time_slot SET booked_count = 0 WHERE booked_count <> 0")
    clear_redis_namespace()


def clear_redis_namespace() -> int:
    """Delete this benchmark's keys only (SCAN + UNLINK): the Redis is shared, never flushed."""
    client = redis.Redis.from_url(REDIS_URL)
    n = 0
    try:
        batch: list[bytes] = []
        for k in client.scan_iter(match=f"{NAMESPACE}:*", count=1000):
            batch.append(k)
            if len(batch) >= 1000:
                n += client.unlink(*batch)
                batch.clear()
        if batch:
            n += client.unlink(*batch)
    finally:
        client.close()
    return n


def mint_patients(path: Path, first_id: int, count: int, role: str = "patient") -> Path:
    """One line per patient: ``<id> <jwt>``; wrk's Lua reads it in init()."""
    now = datetime.now(UTC)
    ttl = timedelta(hours=6)
    with path.open("w") as f:
        for pid in range(first_id, first_id + count):
            sub = pid if role == "patient" else 1
            f.write(f"{pid} {mint_token(JWT_SECRET, role, sub, ttl, now)}\n")
    return path


# --- the processes under test -------------------------------------------------


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


def http_get(url: str, token: str | None = None, timeout: float = 2.0) -> tuple[int, bytes]:
    req = urllib.request.Request(url)
    if token:
        req.add_header("Authorization", f"Bearer {token}")
    try:
        with urllib.request.urlopen(req, timeout=timeout) as r:
            return r.status, r.read()
    except urllib.error.HTTPError as e:
        return e.code, e.read()


# How the API under test is served. ``uvicorn``: `reservo api --workers N` (uvicorn,
# uvloop, httptools with the slow-client guards), what production runs. ``granian``:
# the same app factory under granian (a Rust HTTP server) with N workers, to compare
# servers; it carries none of core/http/slow_clients.py's guards. ``up``: `reservo up`,
# one process holding the API and every background role, as a newcomer runs it.
SERVERS = ("uvicorn", "granian", "up")


def parse_servers(text: str) -> list[str]:
    servers = [s.strip() for s in text.split(",") if s.strip()]
    if not servers or set(servers) - set(SERVERS):
        raise SystemExit(f"--server takes a comma-separated list of {', '.join(SERVERS)}")
    return servers


class Reservo:
    """The API (``server``: see SERVERS) plus one `reservo worker` (none for ``up``,
    which runs the background roles itself), started and stopped by us."""

    def __init__(
        self,
        workers: int,
        extra_env: dict[str, str] | None = None,
        server: str = "uvicorn",
        worker_roles: str | None = None,
        callgrind: Path | None = None,
    ) -> None:
        if server not in SERVERS:
            raise ValueError(f"unknown server {server!r}")
        if callgrind is not None and (server != "uvicorn" or workers != 1):
            raise ValueError("--callgrind runs one `reservo api` process: --workers 1, uvicorn")
        # The API under callgrind: its dumps are ``<callgrind>.<pid>[.n]``.
        self.callgrind = callgrind
        self.server = server
        self.workers = 1 if server == "up" else workers
        # `reservo worker --roles ...`; None: its default roles.
        self.worker_roles = worker_roles
        self.port = free_port()
        self.base = f"http://127.0.0.1:{self.port}"
        self.env = {
            **os.environ,
            "RESERVO_DATABASE_URL": db_url(),
            "RESERVO_REDIS_URL": REDIS_URL,
            "RESERVO_REDIS_NAMESPACE": NAMESPACE,
            **SECRETS_ENV,
            "RESERVO_LOG_LEVEL": "WARNING",
            **(extra_env or {}),
        }
        self.logdir = Path(tempfile.mkdtemp(prefix="reservo-bench-"))
        if (server == "granian" and self.workers > 1) or callgrind is not None:
            # What `reservo api --workers N` sets up for the metrics of N processes.
            # Under callgrind too: its one process then pays for its metrics as the
            # runners' default two workers do, and no exemplar (a request is slower
            # than 0.1 s there, and such a request always carries one).
            self.env.setdefault("PROMETHEUS_MULTIPROC_DIR", str(self.logdir))
        self.api: subprocess.Popen[bytes] | None = None
        self.worker: subprocess.Popen[bytes] | None = None

    def _spawn(self, args: list[str], log: str) -> subprocess.Popen[bytes]:
        out = (self.logdir / log).open("wb")
        return subprocess.Popen(
            args,
            env=self.env,
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,  # Ctrl-C of the runner reaches us, not them
        )

    def _api_command(self) -> list[str]:
        if self.callgrind is not None:
            return [*callgrind_command(self.callgrind), *self._server_command()]
        return self._server_command()

    def _server_command(self) -> list[str]:
        port = str(self.port)
        if self.server == "up":
            return [str(BIN / "reservo"), "up", "--port", port]
        if self.server == "granian":
            return [
                str(BIN / "granian"), "reservo.app:from_environment", "--factory",
                "--interface", "asgi", "--http", "1", "--no-ws", "--loop", "uvloop",
                "--workers", str(self.workers), "--host", "127.0.0.1", "--port", port,
                "--log-level", "warning", "--no-access-log",
            ]  # fmt: skip
        return [str(BIN / "reservo"), "api", "--workers", str(self.workers), "--port", port]

    def __enter__(self) -> Reservo:
        self.api = self._spawn(self._api_command(), "api.log")
        if self.server != "up":
            roles = [] if self.worker_roles is None else ["--roles", self.worker_roles]
            self.worker = self._spawn([str(BIN / "reservo"), "worker", *roles], "worker.log")
        try:
            self._wait_ready()
        except BaseException:
            self.__exit__()  # __exit__ is not called when __enter__ raises
            raise
        return self

    def _wait_ready(self, timeout_s: float = 120.0) -> None:
        if self.callgrind is not None:  # the interpreter starts some 50 times slower
            timeout_s *= 5
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            assert self.api is not None
            if self.api.poll() is not None:
                raise RuntimeError(f"reservo api exited; see {self.logdir / 'api.log'}")
            with contextlib.suppress(OSError):
                # Every worker process must be up, not just the first one.
                if len(self.api_workers()) >= self.workers and all(
                    http_get(f"{self.base}/readyz")[0] == 200 for _ in range(20)
                ):
                    time.sleep(0.5)
                    return
            time.sleep(0.2)
        raise RuntimeError(f"reservo api not ready in {timeout_s} s; see {self.logdir}")

    def api_workers(self) -> list[psutil.Process]:
        """The serving processes: uvicorn's workers, or its single process; granian
        always serves from worker processes of its own, even with one worker."""
        assert self.api is not None
        parent = psutil.Process(self.api.pid)
        if self.workers == 1 and self.server != "granian":
            return [parent]
        kids = []
        for p in parent.children(recursive=True):
            # A helper that exited a moment ago (a zombie) is no worker either.
            with contextlib.suppress(psutil.Error):
                if "multiprocessing.resource_tracker" not in " ".join(p.cmdline()):
                    kids.append(p)
        return kids

    def own_processes(self) -> list[psutil.Process]:
        """Every reservo process: the API supervisor, its workers, the background worker."""
        assert self.api is not None
        procs = [psutil.Process(p.pid) for p in (self.api, self.worker) if p is not None]
        for p in list(procs):
            with contextlib.suppress(psutil.Error):
                procs.extend(p.children(recursive=True))
        return procs

    def __exit__(self, *exc: object) -> None:
        for proc in (self.api, self.worker):
            if proc is not None and proc.poll() is None:
                proc.send_signal(signal.SIGTERM)
        for proc in (self.api, self.worker):
            if proc is None:
                continue
            try:
                proc.wait(timeout=15)
            except subprocess.TimeoutExpired:
                # Only our own session: the pid we started and its children.
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()

    def error_lines(self) -> list[str]:
        """Tracebacks/errors the processes logged (a 5xx leaves one there)."""
        found = []
        for log in ("api.log", "worker.log"):
            if not (self.logdir / log).exists():  # `up` has no worker of its own
                continue
            text = (self.logdir / log).read_text(errors="replace")
            found += [ln for ln in text.splitlines() if re.search(r"error|Traceback", ln, re.I)]
        return found


# --- memory -------------------------------------------------------------------


@dataclass
class RssSampler:
    """Samples the summed RSS (and PSS, which does not count shared pages twice) of
    reservo's processes every ``interval_s`` in a background thread."""

    reservo: Reservo
    interval_s: float = 0.5
    peak_rss: int = 0
    peak_pss: int = 0
    peak_by_proc: dict[str, int] = field(default_factory=dict)
    _stop: threading.Event = field(default_factory=threading.Event)
    _thread: threading.Thread | None = None

    def _sample(self) -> None:
        rss = pss = 0
        for p in self.reservo.own_processes():
            with contextlib.suppress(psutil.Error):
                mem = p.memory_full_info()
                rss += mem.rss
                pss += getattr(mem, "pss", mem.rss)
                name = f"{p.pid}:{' '.join(p.cmdline()[1:3])[:40]}"
                self.peak_by_proc[name] = max(self.peak_by_proc.get(name, 0), mem.rss)
        self.peak_rss, self.peak_pss = max(self.peak_rss, rss), max(self.peak_pss, pss)

    def _run(self) -> None:
        while not self._stop.wait(self.interval_s):
            self._sample()

    def __enter__(self) -> RssSampler:
        self._sample()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join()
        self._sample()


# --- CPU accounting -----------------------------------------------------------


def _cpu(p: psutil.Process) -> float:
    t = p.cpu_times()
    return float(t.user + t.system)


def _idle(t: Any) -> float:
    return float(t.idle + getattr(t, "iowait", 0.0))


def cpu_s(pids: Sequence[int | None]) -> float:
    """User + system CPU seconds of these processes so far (gone ones count 0)."""
    total = 0.0
    for pid in pids:
        if pid is not None:
            with contextlib.suppress(psutil.Error):
                total += _cpu(psutil.Process(pid))
    return total


def postgres_cpu_s() -> float:
    """All of PostgreSQL's CPU so far: the postmaster, its live backends, and (in
    the postmaster's children times) every backend that already exited, such as
    the ones of a relay that finished."""
    total = 0.0
    for proc in psutil.process_iter(["name", "ppid"]):
        try:
            if proc.info["name"] != "postgres":
                continue
            if psutil.Process(proc.info["ppid"]).name() == "postgres":
                continue  # a backend: counted through its postmaster
            t = proc.cpu_times()
            total += t.user + t.system + t.children_user + t.children_system
            total += sum(_cpu(c) for c in proc.children())
        except psutil.NoSuchProcess:
            pass
    return total


@dataclass
class CpuMeter:
    """CPU seconds spent during a measurement by reservo's processes, by the
    PostgreSQL backends serving the benchmark database, and by the whole machine.

    The machine is shared (other test runs may be busy), so besides the rate we
    report CPU per request, which does not depend on how much CPU we were given.
    """

    reservo: Reservo
    by_group: dict[str, float] = field(default_factory=dict)
    # read and write system calls by group (/proc/<pid>/io's syscr and syscw)
    syscalls: dict[str, tuple[int, int]] = field(default_factory=dict)
    machine_busy_s: float = 0.0
    wall_s: float = 0.0
    _start: dict[int, tuple[str, float]] = field(default_factory=dict)
    _io_start: dict[int, tuple[int, int]] = field(default_factory=dict)
    # mean items per batch since the server started, per batcher (its /metrics)
    batches: dict[str, float] = field(default_factory=dict)
    _t0: float = 0.0
    _m0: Any = None

    def _snapshot(self) -> dict[int, tuple[str, float]]:
        snap: dict[int, tuple[str, float]] = {}
        for p in self.reservo.own_processes():
            with contextlib.suppress(psutil.Error):
                snap[p.pid] = ("reservo", _cpu(p))
        for p in psutil.process_iter(["cmdline"]):
            with contextlib.suppress(psutil.Error):
                title = " ".join(p.info["cmdline"] or ())
                if title.startswith("postgres:") and f" {DB_NAME} " in title:
                    snap[p.pid] = ("postgres", _cpu(p))
                elif "redis-server" in title:
                    snap[p.pid] = ("redis (shared)", _cpu(p))
        return snap

    def _io(self, pids: Iterable[int]) -> dict[int, tuple[int, int]]:
        return {pid: io for pid in pids if (io := syscalls_of(pid)) is not None}

    def __enter__(self) -> CpuMeter:
        self._start = self._snapshot()
        self._io_start = self._io(self._start)
        self._t0, self._m0 = time.monotonic(), psutil.cpu_times()
        return self

    def __exit__(self, *exc: object) -> None:
        end = self._snapshot()
        m1 = psutil.cpu_times()
        self.wall_s = time.monotonic() - self._t0
        idle = (m1.idle + getattr(m1, "iowait", 0)) - (
            self._m0.idle + getattr(self._m0, "iowait", 0)
        )
        total = sum(m1) - sum(self._m0)
        self.machine_busy_s = total - idle
        io_end = self._io(end)
        self.batches = batch_means(self.reservo.base)
        for pid, (group, cpu) in end.items():
            # A process born during the run spent all its CPU inside it.
            start = self._start.get(pid, (group, 0.0))[1]
            self.by_group[group] = self.by_group.get(group, 0.0) + max(0.0, cpu - start)
            if pid in io_end:
                (r0, w0), (r1, w1) = self._io_start.get(pid, (0, 0)), io_end[pid]
                r, w = self.syscalls.get(group, (0, 0))
                self.syscalls[group] = (r + max(0, r1 - r0), w + max(0, w1 - w0))

    def figures(self, requests: int, wrk_cpu_s: float) -> dict[str, float]:
        """CPU ms per request by group, the machine's busy share, and what the rate
        would be if the benchmark had every core to itself (an estimate, labelled so)."""
        cores = os.cpu_count() or 1
        ours = sum(self.by_group.values()) + wrk_cpu_s
        n = max(1, requests)
        out = {f"cpu_ms_per_req_{g.split()[0]}": 1000 * v / n for g, v in self.by_group.items()}
        out["cpu_ms_per_req_wrk"] = 1000 * wrk_cpu_s / n
        for name, mean in self.batches.items():
            out[f"batch_items_{name}"] = mean
        for g, (r, w) in self.syscalls.items():
            out[f"reads_per_req_{g.split()[0]}"] = r / n
            out[f"writes_per_req_{g.split()[0]}"] = w / n
        out["machine_busy_pct"] = 100 * self.machine_busy_s / max(1e-9, cores * self.wall_s)
        out["our_share_pct"] = 100 * ours / max(1e-9, cores * self.wall_s)
        out["rate_if_machine_were_ours"] = n * cores / max(1e-9, ours) if ours else 0.0
        return out


def describe_cpu(c: dict[str, float]) -> str:
    per = ", ".join(
        f"{k.removeprefix('cpu_ms_per_req_')} {v:.2f}"
        for k, v in c.items()
        if k.startswith("cpu_ms_per_req_")
    )
    calls = ", ".join(
        f"{k.removeprefix('reads_per_req_')} {v:.2f} / {c.get('writes_per_req_' + k[14:], 0):.2f}"
        for k, v in c.items()
        if k.startswith("reads_per_req_")
    )
    batches = ", ".join(
        f"{k.removeprefix('batch_items_')} {v:.1f}" for k, v in c.items() if k.startswith("batch_")
    )
    more = [f"read / write system calls per request: {calls}"] if calls else []
    if batches:
        more.append(f"items per batch (mean since the server started): {batches}")
    if "instructions_per_req" in c:
        n = c["instructions_per_req"]
        more.append(f"instructions per request of the API (callgrind): {n:,.0f}")
    return "".join(
        [
            f"CPU ms per request: {per}; machine busy {c['machine_busy_pct']:.0f}% of all "
            f"cores, this benchmark {c['our_share_pct']:.0f}%; estimated rate with the cores "
            f"to ourselves {c['rate_if_machine_were_ours']:,.0f}/s",
            *(f"\n  {line}" for line in more),
        ]
    )


def batch_means(base: str) -> dict[str, float]:
    """Mean items per batch of each batcher (``reservo_batch_items``), from the
    server's /metrics; empty when it has none (a release before the metric)."""
    try:
        status, body = http_get(f"{base}/metrics")
    except OSError:
        return {}
    if status != 200:
        return {}
    sums: dict[str, float] = {}
    counts: dict[str, float] = {}
    for line in body.decode().splitlines():
        m = re.match(r'reservo_batch_items_(sum|count)\{batch="([^"]+)"\} (\S+)', line)
        if m:
            (sums if m[1] == "sum" else counts)[m[2]] = float(m[3])
    return {name: sums.get(name, 0.0) / n for name, n in counts.items() if n}


def syscalls_of(pid: int) -> tuple[int, int] | None:
    """The read and write system calls a process made so far (``syscr`` and
    ``syscw`` of /proc/<pid>/io), None when unreadable: ``read``/``write`` and
    their vector forms, which uvloop uses for every socket; ``send``/``recv``
    (PostgreSQL's backends use them) are not counted. A loopback write is where
    the kernel delivers the segment to its reader, the dearest call of a
    request on a virtual machine (docs/BENCHMARKS.md)."""
    with contextlib.suppress(psutil.Error, AttributeError):
        io = psutil.Process(pid).io_counters()
        return int(io.read_count), int(io.write_count)
    return None


# --- wrk ----------------------------------------------------------------------


@dataclass(frozen=True)
class WrkResult:
    duration_s: float
    requests: int
    statuses: dict[str, int]  # "201", "409 slot_full", ...
    p50_ms: float
    p90_ms: float
    p99_ms: float
    max_ms: float
    socket_errors: dict[str, int]
    wrk_cpu_s: float  # wrk's own user+sys CPU: the load generator shares the 2 cores

    @property
    def rate(self) -> float:
        return self.requests / self.duration_s

    def count(self, prefix: str) -> int:
        return sum(n for k, n in self.statuses.items() if k.startswith(prefix))


def run_wrk(
    script: Path,
    url: str,
    threads: int,
    connections: int,
    duration_s: float,
    args: Sequence[str],
    timeout_s: int = 10,
) -> WrkResult:
    wrk = shutil.which("wrk")
    if wrk is None:
        raise SystemExit("wrk not found: apt-get install -y wrk")
    cmd = [
        wrk,
        f"-t{threads}",
        f"-c{connections}",
        f"-d{max(1, round(duration_s))}s",
        f"--timeout={timeout_s}s",
        "-s",
        str(script),
        url,
        "--",
        *args,
    ]
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    done = subprocess.run(cmd, capture_output=True, text=True, check=False)
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    if done.returncode != 0:
        raise RuntimeError(f"wrk failed ({done.returncode}): {done.stderr or done.stdout}")
    out = done.stdout
    line = next((ln for ln in out.splitlines() if ln.startswith("WRK_JSON ")), None)
    if line is None:
        raise RuntimeError(f"wrk printed no summary:\n{out}")
    raw = json.loads(line.removeprefix("WRK_JSON "))
    return WrkResult(
        duration_s=raw["duration_us"] / 1e6,
        requests=raw["requests"],
        statuses={str(k): int(v) for k, v in raw["statuses"].items()},
        p50_ms=raw["p50_us"] / 1000,
        p90_ms=raw["p90_us"] / 1000,
        p99_ms=raw["p99_us"] / 1000,
        max_ms=raw["max_us"] / 1000,
        socket_errors={k: int(v) for k, v in raw["errors"].items() if v},
        wrk_cpu_s=(after.ru_utime + after.ru_stime) - (before.ru_utime + before.ru_stime),
    )


@dataclass
class Drive:
    """What one measured wrk run gives: wrk's figures, memory, CPU, and (when
    asked) the wait events of the benchmark database's busy backends."""

    wrk: WrkResult
    mem: RssSampler
    cpu: CpuMeter
    waits: Counter[str]


def drive(
    rv: Reservo,
    script: Path,
    threads: int,
    connections: int,
    duration_s: float,
    args: Sequence[str],
    profile_out: Path | None = None,
    sample_waits: bool = False,
) -> Drive:
    """Run wrk against ``rv`` while sampling RSS and CPU (and py-spy of the first
    API worker into ``profile_out``, pg_stat_activity wait events when asked)."""
    waits: Counter[str] = Counter()
    with RssSampler(rv) as mem, CpuMeter(rv) as cpu, WaitSampler(waits, sample_waits):
        if profile_out is not None:
            pid = rv.api_workers()[0].pid
            with profiled(pid, max(1.0, duration_s - 2), profile_out):
                res = run_wrk(script, rv.base, threads, connections, duration_s, args)
        else:
            res = run_wrk(script, rv.base, threads, connections, duration_s, args)
    return Drive(res, mem, cpu, waits)


class WaitSampler:
    """Every 20 ms, what each active backend of the benchmark database is doing:
    ``CPU`` (no wait event: running), or its wait event (``Lock:transactionid``,
    ``LWLock:WALWrite``, ``IO:WALSync``, ``Client:ClientRead``...). The shares
    tell row-lock waits apart from CPU and commit flushes."""

    _SQL = """
    SELECT coalesce(wait_event_type || ':' || wait_event, 'CPU') AS w, count(*) AS n
      FROM pg_stat_activity
     WHERE datname = $1 AND state = 'active' AND pid <> pg_backend_pid()
     GROUP BY 1"""

    def __init__(self, into: Counter[str], enabled: bool = True) -> None:
        self.into, self.enabled = into, enabled
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    async def _loop(self) -> None:
        conn = await connect(PG_ADMIN_URL)
        try:
            while not self._stop.is_set():
                for row in await conn.fetch(self._SQL, DB_NAME):
                    self.into[row["w"]] += row["n"]
                await asyncio.sleep(0.02)
        finally:
            await conn.close()

    def __enter__(self) -> WaitSampler:
        if self.enabled:
            self._thread = threading.Thread(target=asyncio.run, args=(self._loop(),), daemon=True)
            self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join()


def describe_waits(waits: Counter[str]) -> str:
    """Shares of the sampled backend states, largest first."""
    total = sum(waits.values())
    if not total:
        return "no active backend sampled"
    return ", ".join(f"{k} {100 * n / total:.0f}%" for k, n in waits.most_common(8))


# --- the framework ceiling ----------------------------------------------------


@dataclass(frozen=True)
class Ceiling:
    """A bare FastAPI hello on the same server stack and worker count, measured by
    the same wrk settings right after the run it is compared with."""

    workers: int
    threads: int
    connections: int
    per_s: float
    p99_ms: float
    load_avg: float  # 1-minute load average just before it was measured
    cpu_ms_per_req: float = float("nan")  # the hello server's own CPU
    reads_per_req: float = float("nan")  # and its read / write system calls
    writes_per_req: float = float("nan")

    def ratio(self, rate: float) -> float:
        return rate / self.per_s if self.per_s else float("nan")

    def describe(self, rate: float, what: str = "") -> str:
        label = f" {what}" if what else ""
        return (
            f"ceiling (bare FastAPI hello, {self.workers} uvicorn workers, uvloop+httptools, "
            f"wrk -t{self.threads} -c{self.connections}): {self.per_s:,.0f} req/s, "
            f"p99 {self.p99_ms:.1f} ms, its CPU {self.cpu_ms_per_req:.3f} ms/req, "
            f"read / write system calls {self.reads_per_req:.2f} / {self.writes_per_req:.2f} "
            f"per req; ratio{label} {self.ratio(rate):.2f}; load avg {self.load_avg:.2f}"
        )


def hello_ceiling(workers: int, threads: int, connections: int, duration_s: float) -> Ceiling:
    """Start `uvicorn hello_app:app` as `reservo api` starts its server (same loop,
    parser, worker count), drive it with wrk, stop it."""
    load = os.getloadavg()[0]
    with hello_process(workers) as (port, pid):
        tree = [psutil.Process(pid), *psutil.Process(pid).children(recursive=True)]
        cpu0, io0 = sum(_cpu(p) for p in tree), [syscalls_of(p.pid) or (0, 0) for p in tree]
        base = f"http://127.0.0.1:{port}"
        res = run_wrk(BENCH_DIR / "hello.lua", base, threads, connections, duration_s, [])
        cpu1, io1 = sum(_cpu(p) for p in tree), [syscalls_of(p.pid) or (0, 0) for p in tree]
    n = max(1, res.requests)
    reads = sum(b[0] - a[0] for a, b in zip(io0, io1, strict=True)) / n
    writes = sum(b[1] - a[1] for a, b in zip(io0, io1, strict=True)) / n
    return Ceiling(
        workers, threads, connections, res.rate, res.p99_ms, load,
        1000 * (cpu1 - cpu0) / n, reads, writes,
    )  # fmt: skip


@contextlib.contextmanager
def hello_server(workers: int) -> Iterator[int]:
    """The bare hello served as `reservo api` serves reservo (uvicorn, uvloop,
    httptools, ``workers`` processes), ready; its port. Stopped on exit."""
    with hello_process(workers) as (port, _):
        yield port


@contextlib.contextmanager
def hello_process(workers: int) -> Iterator[tuple[int, int]]:
    """``hello_server``'s port and its uvicorn process id."""
    port = free_port()
    cmd = [
        sys.executable, "-m", "uvicorn", "hello_app:app", "--app-dir", str(BENCH_DIR),
        "--host", "127.0.0.1", "--port", str(port), "--workers", str(workers),
        "--loop", "uvloop", "--http", "httptools", "--no-access-log", "--log-level", "warning",
    ]  # fmt: skip
    proc = subprocess.Popen(
        cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True
    )
    try:
        base = f"http://127.0.0.1:{port}"
        deadline = time.monotonic() + 30
        while True:
            if proc.poll() is not None:
                raise RuntimeError("the hello ceiling server exited")
            with contextlib.suppress(OSError):
                if all(http_get(f"{base}/hello")[0] == 200 for _ in range(20)):
                    break
            if time.monotonic() > deadline:
                raise RuntimeError("the hello ceiling server did not start")
            time.sleep(0.2)
        time.sleep(0.5 if workers > 1 else 0.1)  # every worker up
        yield port, proc.pid
    finally:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout=15)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()


def add_ceiling_option(parser: Any) -> None:
    parser.add_argument(
        "--ceiling-duration",
        type=float,
        default=5,
        help="seconds of the bare-hello ceiling measured after each run (0: skip)",
    )


# --- py-spy -------------------------------------------------------------------


def add_profile_options(parser: Any) -> None:
    """``--profile F``, ``--native`` and ``--callgrind PREFIX``, for a runner
    that profiles one API worker or counts its instructions."""
    parser.add_argument("--profile", type=Path, help="py-spy raw profile of one API worker, run 1")
    parser.add_argument(
        "--native",
        action="store_true",
        help="with --profile: C frames too (system calls); py-spy then pauses the worker",
    )
    parser.add_argument(
        "--callgrind",
        type=Path,
        metavar="PREFIX",
        help="run the one API process (--workers 1) under callgrind and report its "
        "instructions per request over each measured run (dumps: PREFIX.<pid>.<n>)",
    )


# --- callgrind ------------------------------------------------------------------
# Instructions per request move neither with the machine's load nor with its speed:
# the figure to compare two trees by on a shared machine. Under callgrind the server
# runs some 50 times slower, so its queues and batches are not the real run's:
# compare two trees under callgrind, never a callgrind figure with a real run's.


def callgrind_command(prefix: Path) -> list[str]:
    """valgrind's callgrind in front of a command: its dumps are ``prefix.<pid>.<n>``."""
    if shutil.which("valgrind") is None:
        raise SystemExit("valgrind not found: apt-get install valgrind")
    return [
        "valgrind",
        "--tool=callgrind",
        f"--callgrind-out-file={prefix}.%p",
        "--dump-instr=no",
    ]


@dataclass
class Instructions:
    """What a process under callgrind executed between ``counted``'s zero and
    dump (None: not counted)."""

    total: int | None = None

    def figures(self, requests: int) -> dict[str, float]:
        if self.total is None:
            return {}
        return {"instructions_per_req": self.total / max(1, requests)}


@contextlib.contextmanager
def counted(pid: int, prefix: Path) -> Iterator[Instructions]:
    """The instructions ``pid`` (under callgrind, dumping to ``prefix``) executes
    inside the block: its counters zeroed on entry and dumped on exit."""
    got = Instructions()
    subprocess.run(["callgrind_control", "-z", str(pid)], capture_output=True, check=True)
    yield got
    subprocess.run(["callgrind_control", "-d", str(pid)], capture_output=True, check=True)
    dumps = sorted(
        prefix.parent.glob(f"{prefix.name}.{pid}.*"), key=lambda p: int(p.name.rsplit(".", 1)[1])
    )
    if not dumps:
        raise RuntimeError(f"callgrind wrote no dump for {pid} at {prefix}.{pid}.<n>")
    # "summary:" is the dump's total of the event counted (Ir).
    m = re.search(rb"^summary: (\d+)$", dumps[-1].read_bytes(), re.M)
    if m is None:
        raise RuntimeError(f"no summary line in {dumps[-1]}")
    got.total = int(m[1])


@contextlib.contextmanager
def watched(rv: Reservo, opts: Any, profile_out: Path | None) -> Iterator[Instructions]:
    """Around a runner's measured run: the API's instructions counted when it runs
    under callgrind (``--callgrind``), else a py-spy profile of its first worker
    into ``profile_out`` when one is asked for, else nothing."""
    pid = rv.api_workers()[0].pid
    if rv.callgrind is not None:
        with counted(pid, rv.callgrind) as got:
            yield got
    elif profile_out is not None:
        with profiled(pid, max(1.0, opts.duration - 2), profile_out, opts.native):
            yield Instructions()
    else:
        yield Instructions()


@contextlib.contextmanager
def profiled(pid: int, seconds: float, out: Path, native: bool = False) -> Iterator[None]:
    """`py-spy record` of one API worker in raw (collapsed stacks) format;
    ``native``: with C frames (the system calls, the C extensions' own time),
    which py-spy takes by pausing the worker at each sample (slower runs)."""
    pyspy = BIN / "py-spy"
    if not pyspy.exists():
        raise SystemExit("py-spy not found in the venv: pip install py-spy")
    proc = subprocess.Popen(
        [
            str(pyspy),
            "record",
            "--pid",
            str(pid),
            "--duration",
            str(int(seconds)),
            "--rate",
            "250",
            # Else do not pause the worker: the profile must not slow it.
            *(["--native"] if native else ["--nonblocking"]),
            "--format",
            "raw",
            "--output",
            str(out),
        ],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        yield
    finally:
        proc.wait(timeout=seconds + 30)


# Buckets for "what limits the figures", matched against a frame's file path.
BUCKETS: tuple[tuple[str, str], ...] = (
    ("libc.so", "system calls and libc (--native only: write, read, getpid ...)"),
    ("jwt/", "JWT decode (PyJWT + hmac)"),
    ("hmac.py", "JWT decode (PyJWT + hmac)"),
    ("asyncpg/", "asyncpg (PostgreSQL driver)"),
    ("redis/", "redis-py (Redis round trips)"),
    ("pydantic", "pydantic (validation/serialisation)"),
    ("fastapi/", "FastAPI (routing, dependencies, encoders)"),
    ("starlette/", "Starlette (middleware, requests, responses)"),
    ("uvicorn/", "uvicorn + httptools (HTTP parsing)"),
    ("json/", "stdlib json"),
    ("prometheus_client/", "prometheus metrics"),
    ("structlog/", "logging"),
    ("logging/", "logging"),
    ("anyio/", "anyio (thread pool hops, task groups)"),
    ("asyncio/", "asyncio machinery"),
    ("reservo/", "reservo code itself"),
)


def summarize_profile(path: Path, top: int = 15) -> str:
    """Self time by bucket (the frame that was on CPU), plus inclusive time of the
    busiest reservo/library functions."""
    leaf: Counter[str] = Counter()
    leaf_fn: Counter[str] = Counter()
    incl: Counter[str] = Counter()
    total = parked = 0
    for line in path.read_text().splitlines():
        stack, _, n = line.rpartition(" ")
        if not n.isdigit():
            continue
        count = int(n)
        frames = stack.split(";")
        # Helper threads parked in a wait (uvicorn's supervisor ping, an idle thread
        # pool) are not CPU the request path spends; --nonblocking cannot tell.
        # (A native stack ends in the wait's system call, under the parked frame.)
        if any(w in f for w in _PARKED for f in frames[-3:]):
            parked += count
            continue
        total += count
        # Attribute the sample to the innermost frame that belongs to a known bucket.
        bucket = "other (interpreter, C extensions, stdlib)"
        for fr in reversed(frames):
            hit = next((name for pat, name in BUCKETS if pat in fr), None)
            if hit is not None:
                bucket = hit
                break
        leaf[bucket] += count
        leaf_fn[_short(frames[-1])] += count
        for fn in {_short(fr) for fr in frames}:
            incl[fn] += count
    if total == 0:
        return "no samples (is py-spy allowed to ptrace?)"
    lines = [
        f"{total} samples on CPU ({parked} more in parked helper threads, left out); "
        "self time by library (innermost known frame):"
    ]
    lines += [f"  {100 * n / total:5.1f}%  {name}" for name, n in leaf.most_common()]
    lines.append("hottest leaf functions (self time):")
    lines += [f"  {100 * n / total:5.1f}%  {name}" for name, n in leaf_fn.most_common(top)]
    lines.append("inclusive time of request-path functions:")
    wanted = [
        (fn, n)
        for fn, n in incl.most_common()
        if any(k in fn for k in ("reservo/", "jwt/", "asyncpg/", "redis/", "json", "pydantic"))
    ]
    lines += [f"  {100 * n / total:5.1f}%  {fn}" for fn, n in wanted[:top]]
    return "\n".join(lines)


_PARKED = (
    "Condition.wait (threading",
    "Connection._recv (multiprocessing",
    "Event.wait (threading",
)


def _short(frame: str) -> str:
    """`book (reservo/appointments/api.py:123)` without the site-packages prefix."""
    m = re.match(r"^(?P<fn>.*?) \((?P<file>.*?)(?::\d+)?\)$", frame)
    if not m:
        return frame
    f = m["file"]
    for marker in ("site-packages/", "/src/", "lib/python3.11/"):
        if marker in f:
            f = f.split(marker, 1)[1]
    return f"{m['fn']} ({f})"


# --- reporting ----------------------------------------------------------------


def reservo_source() -> str:
    import reservo

    return str(Path(reservo.__file__).resolve().parent)


def machine() -> str:
    mem_gb = psutil.virtual_memory().total / 2**30
    cpu = platform.processor() or platform.machine()
    return (
        f"{os.cpu_count()} cores ({cpu}), {mem_gb:.0f} GiB RAM, {platform.system()} "
        f"{platform.release()}, Python {platform.python_version()}, "
        f"load avg before run {os.getloadavg()[0]:.2f}"
    )


def median(xs: Sequence[float]) -> float:
    return statistics.median(xs) if xs else float("nan")


def parse_ints(text: str) -> list[int]:
    return [int(x) for x in text.split(",") if x.strip()]


def stop_cleanly_on_signals() -> None:
    """SIGTERM (and SIGINT, which a background shell starts ignored) unwind the
    runner through its context managers, so the processes it started are stopped."""

    def _exit(signum: int, _frame: object) -> None:
        raise SystemExit(128 + signum)

    signal.signal(signal.SIGTERM, _exit)
    signal.signal(signal.SIGINT, _exit)


def run_async(coro: Any) -> Any:
    return asyncio.run(coro)


def sweep(
    opts: Any,
    bench: str,
    run_one: Callable[..., Any],
    describe: Callable[[Any], str],
    rate: Callable[[Any], float],
    servers: Sequence[str] | None = None,
) -> tuple[list[tuple[int, int, int]], list[Any], list[Ceiling | None]]:
    """Run every (workers, threads, connections) configuration ``opts.runs`` times,
    printing each run, appending it to ``opts.json`` when given, and summarising the
    py-spy profile taken on the first run. After each run the hello ceiling of the
    same configuration is measured and the run's ``rate`` printed as a ratio of it.

    With ``servers`` (see SERVERS), ``run_one`` also gets the server, and each run
    goes through every server in turn (interleaved, so a noisy minute of the shared
    machine hits them alike). ``up`` is one process: it runs once per (threads,
    connections), with workers 1, and is compared with the hello in one process.
    Each server's first run is profiled (``<profile stem>-<server>``) when asked.
    Returns the configurations, results and ceilings (parallel to the results)."""
    configs = list(
        itertools.product(
            parse_ints(opts.workers), parse_ints(opts.threads), parse_ints(opts.connections)
        )
    )
    results: list[Any] = []
    ceilings: list[Ceiling | None] = []
    profiles: list[Path] = []
    for run in range(opts.runs):
        for server in servers or [None]:
            todo = configs
            if server == "up":
                todo = list(dict.fromkeys((1, t, c) for _, t, c in configs))
            for i, (w, t, c) in enumerate(todo):
                prof = None
                if opts.profile and run == 0 and i == 0:
                    prof = opts.profile
                    if server is not None and len(servers or ()) > 1:
                        prof = prof.with_name(f"{prof.stem}-{server}{prof.suffix}")
                    profiles.append(prof)
                r = run_one(w, t, c, prof) if server is None else run_one(w, t, c, prof, server)
                results.append(r)
                label = "" if server is None else f" {server}"
                print(f"[run {run + 1}/{opts.runs}{label}] {describe(r)}", flush=True)
                ceiling = None
                if getattr(opts, "ceiling_duration", 0) > 0:
                    ceiling = hello_ceiling(w, t, c, opts.ceiling_duration)
                    print(f"  {ceiling.describe(rate(r))}", flush=True)
                ceilings.append(ceiling)
                if opts.json:
                    with opts.json.open("a") as f:
                        record: dict[str, Any] = {"bench": bench, **dataclasses.asdict(r)}
                        if ceiling is not None:
                            record["ceiling"] = dataclasses.asdict(ceiling)
                            record["ceiling_ratio"] = ceiling.ratio(rate(r))
                        record["when"] = time.strftime("%Y-%m-%dT%H:%M:%S%z")
                        record["duration_s"] = opts.duration
                        record["reservo_src"] = reservo_source()
                        f.write(json.dumps(record) + "\n")
    for prof in profiles:
        if prof.exists():
            print(f"\npy-spy profile of one API worker ({prof}):")
            print(summarize_profile(prof))
    return configs, results, ceilings


def server_summary(
    results: Sequence[Any],
    ceilings: Sequence[Ceiling | None],
    rate: Callable[[Any], float],
    unit: str,
) -> None:
    """The servers side by side (medians of this invocation's runs): each one's
    rate, p99, reservo CPU per request and ratio to the hello ceiling, as a factor
    of uvicorn's at the same configuration; then `reservo up` (one process) per
    core against the two uvicorn workers per core."""
    med = median
    rows: dict[tuple[str, int, int, int], list[tuple[Any, Ceiling | None]]] = {}
    for r, k in zip(results, ceilings, strict=True):
        rows.setdefault((r.server, r.workers, r.threads, r.connections), []).append((r, k))

    def figures(key: tuple[str, int, int, int]) -> dict[str, float]:
        got = rows[key]
        return {
            "rate": med([rate(r) for r, _ in got]),
            "p99": med([r.p99_ms for r, _ in got]),
            "cpu": med([r.cpu["cpu_ms_per_req_reservo"] for r, _ in got]),
            "ceiling": med([k.ratio(rate(r)) for r, k in got if k is not None]),
            "hello": med([k.per_s for _, k in got if k is not None]),
            "n": len(got),
        }

    print("\nservers side by side (medians; x uvicorn = the factor of uvicorn's figure):")
    print(
        f"server   workers  wrk        {unit:>12}  p99 ms  CPU ms/req  vs hello"
        f"  x uvicorn: {unit.split('/')[0]}  p99   CPU"
    )
    for key in sorted(rows, key=lambda k: (k[2], k[3], k[1], SERVERS.index(k[0]))):
        server, w, t, c = key
        f = figures(key)
        base = rows.get(("uvicorn", w, t, c))
        vs = ""
        if base is not None and server != "uvicorn":
            u = figures(("uvicorn", w, t, c))
            vs = (
                f"  {f['rate'] / u['rate']:>12.2f}  {f['p99'] / u['p99']:>4.2f}"
                f"  {f['cpu'] / u['cpu']:>4.2f}"
            )
        print(
            f"{server:<8} {w:>7}  -t{t} -c{c:<4} {f['rate']:>12,.0f}  {f['p99']:>6.1f}"
            f"  {f['cpu']:>10.2f}  {f['ceiling']:>8.2f}{vs}   ({f['n']} runs)"
        )
    for server, w, t, c in rows:
        if server != "up" or ("uvicorn", 2, t, c) not in rows:
            continue
        up, two = figures((server, w, t, c)), figures(("uvicorn", 2, t, c))
        print(
            f"\n`reservo up` (1 process) vs `reservo api --workers 2` per core, -t{t} -c{c}: "
            f"{up['rate']:,.0f} vs {two['rate'] / 2:,.0f} {unit} per core = "
            f"{up['rate'] / (two['rate'] / 2):.2f}; of its hello ceiling: up "
            f"{up['ceiling']:.2f} (hello in 1 process {up['hello']:,.0f}/s), two workers "
            f"{two['ceiling']:.2f} (hello in 2 {two['hello']:,.0f}/s); reservo CPU ms/req "
            f"up {up['cpu']:.2f}, two workers {two['cpu']:.2f}"
        )


def ceiling_summary(
    configs: Sequence[tuple[int, int, int]],
    results: Sequence[Any],
    ceilings: Sequence[Ceiling | None],
    rate: Callable[[Any], float],
    unit: str,
) -> None:
    """Medians of the figure, of the ceilings measured in this invocation and of
    the per-run ratios, per configuration."""
    print("\nvs the framework ceiling (bare FastAPI hello, same invocation), medians:")
    print(f"server   workers  wrk          {unit:>12}  ceiling req/s  ratio   load avg")
    keys = [(getattr(r, "server", "uvicorn"), r.workers, r.threads, r.connections) for r in results]
    for server, w, t, c in dict.fromkeys(keys):
        if (w, t, c) not in configs and server != "up":
            continue
        pairs = [
            (r, k)
            for r, k, key in zip(results, ceilings, keys, strict=True)
            if key == (server, w, t, c) and k is not None
        ]
        if not pairs:
            continue
        print(
            f"{server:<8} {w:>7}  -t{t} -c{c:<4} {median([rate(r) for r, _ in pairs]):>12,.0f}  "
            f"{median([k.per_s for _, k in pairs]):>13,.0f}  "
            f"{median([k.ratio(rate(r)) for r, k in pairs]):>5.2f}   "
            f"{', '.join(f'{k.load_avg:.1f}' for _, k in pairs)}"
        )


def finish(failures: list[str], drop_db: bool, ok: str) -> int:
    """The end of every runner: drop the benchmark database when asked, then print
    the failed checks (exit 1) or what held (exit 0)."""
    if drop_db:
        run_async(drop_database())
        print(f"dropped database {DB_NAME}")
    if failures:
        print("FAILED:\n  " + "\n  ".join(failures))
        return 1
    print(f"OK: {ok}")
    return 0


async def doctor_day(
    http: Any, admin: dict[str, str], *, name: str, tz: str, slot_minutes: int, capacity: int
) -> tuple[int, str, list[int]]:
    """A new doctor with one day of slots (08:00-18:00, the day after tomorrow)
    made through the API (``http``: an httpx.AsyncClient): (doctor, day, slot ids)."""
    r = await http.post("/api/doctors", headers=admin, json={"name": name, "timezone": tz})
    r.raise_for_status()
    doctor = r.json()["id"]
    day = (date.today() + timedelta(days=2)).isoformat()
    r = await http.post(
        f"/api/doctors/{doctor}/schedules",
        headers=admin,
        json={
            "from": day,
            "to": day,
            "weekdays": list(range(1, 8)),
            "startTime": "08:00",
            "endTime": "18:00",
            "slotMinutes": slot_minutes,
            "capacity": capacity,
        },
    )
    r.raise_for_status()
    r = await http.get(f"/api/doctors/{doctor}/slots", params={"date": day}, headers=admin)
    r.raise_for_status()
    return doctor, day, [s["id"] for s in r.json()]
