"""Shared helpers of the scheduler tests: schedulers with fast timings, a
recording handler, an own redis-server for FLUSHALL/restart tests."""

from __future__ import annotations

import asyncio
import contextlib
import shutil
import socket
import subprocess
import tempfile
import time
import uuid
from collections import Counter
from collections.abc import AsyncIterator, Callable, Iterator
from contextlib import asynccontextmanager, contextmanager
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

import asyncpg
import httpx

from reservo.app import create_app
from reservo.bootstrap import Container, build
from reservo.core.db.database import Database
from reservo.core.kernel.clock import Clock, OffsetClock, SystemClock
from reservo.scheduler import Job, Scheduler, SchedulerSettings
from reservo.scheduler.workers import run
from reservo.settings import Settings
from tests.helpers.procs import free_port
from tests.redis_cluster import RedisTarget

# A plain URL is a single Redis.
Redis = str | RedisTarget


def target(redis: Redis) -> RedisTarget:
    return redis if isinstance(redis, RedisTarget) else RedisTarget(redis)


FAST = SchedulerSettings(
    window_s=300,
    loader_period_s=0.2,
    resync_period_s=60,
    mover_idle_s=0.005,
    executor_idle_s=0.05,
    heartbeat_s=0.2,
    reaper_timeout_s=1.5,
    reaper_period_s=0.2,
    backoff_base_s=0.2,
    backoff_max_s=5,
    max_attempts=3,
    executors=2,
)


# Fast scheduler timings for an API stack whose workers a test runs.
FAST_SETTINGS: dict[str, Any] = {
    "scheduler_window_s": 2.0,
    "scheduler_loader_period_s": 0.1,
    "scheduler_mover_idle_s": 0.005,
    "scheduler_executor_idle_s": 0.05,
    "scheduler_heartbeat_s": 0.2,
    "scheduler_reaper_timeout_s": 1.0,
    "scheduler_reaper_period_s": 0.2,
    "scheduler_backoff_base_s": 0.2,
}


@dataclass
class Stack:
    """The whole application on a database of the test's own: an HTTP client,
    the container (whose scheduler the test runs) and a direct connection."""

    container: Container
    client: httpx.AsyncClient
    db: asyncpg.Connection


@asynccontextmanager
async def api_stack(base: Settings, database_url: str, **settings: Any) -> AsyncIterator[Stack]:
    ns = f"stack-{uuid.uuid4().hex[:8]}"
    c = build(
        base.with_(
            **{
                "database_url": database_url,
                "redis_namespace": ns,
                **FAST_SETTINGS,
                **settings,
            }
        ),
        OffsetClock(),
    )
    db = await asyncpg.connect(database_url)
    try:
        app = create_app(c, owns_container=False)
        async with httpx.AsyncClient(
            transport=httpx.ASGITransport(app=app), base_url="http://reservo.test"
        ) as client:
            yield Stack(c, client, db)
    finally:
        await db.close()
        await c.close()
        assert base.redis_url is not None
        await drop_namespace(RedisTarget(base.redis_url, base.redis_cluster), ns)


def category() -> str:
    """A category of this test only: other tests' leftovers are never run here."""
    return f"test.{uuid.uuid4().hex[:12]}"


class Recorder:
    """An idempotency-agnostic handler that records every call (wall-clock start)."""

    def __init__(self, delay_s: float = 0.0, fail: bool = False) -> None:
        self.calls: Counter[int] = Counter()
        self.starts: dict[int, list[float]] = {}
        self.delay_s, self.fail = delay_s, fail

    async def __call__(self, job: Job) -> None:
        self.calls[job.id] += 1
        self.starts.setdefault(job.id, []).append(time.time())
        if self.delay_s:
            await asyncio.sleep(self.delay_s)
        if self.fail:
            raise RuntimeError(f"handler refuses job {job.id}")


def make(
    database_url: str,
    redis: Redis,
    ns: str,
    clock: Clock | None = None,
    **overrides: Any,
) -> Scheduler:
    db = Database(database_url, min_size=1, max_size=10)
    mover_lock = overrides.pop("mover_lock", True)
    cfg = FAST.model_copy(update=overrides)
    s = Scheduler(
        db, clock or SystemClock(), target(redis).client(5.0), ns, cfg, mover_lock=mover_lock
    )

    async def _close_db() -> None:
        await db.close()

    s.on_close(_close_db)
    return s


@asynccontextmanager
async def running(*schedulers: Scheduler) -> AsyncIterator[asyncio.Event]:
    stop = asyncio.Event()
    tasks = [asyncio.create_task(run(s, stop)) for s in schedulers]
    try:
        yield stop
    finally:
        stop.set()
        await asyncio.wait_for(asyncio.gather(*tasks, return_exceptions=True), 30)


async def statuses(db: asyncpg.Connection, cat: str) -> Counter[str]:
    rows = await db.fetch(
        "SELECT status, count(*) AS n FROM scheduled_job WHERE category = $1 GROUP BY status", cat
    )
    return Counter({r["status"]: r["n"] for r in rows})


async def done_log_duplicates(db: asyncpg.Connection, cat: str) -> int:
    """Jobs of ``cat`` with more than one DONE attempt in the execution log."""
    return int(
        await db.fetchval(
            """SELECT count(*) FROM (
                 SELECT e.job_id FROM job_execution e JOIN scheduled_job j ON j.id = e.job_id
                  WHERE j.category = $1 AND e.outcome = 'DONE'
                  GROUP BY e.job_id HAVING count(*) > 1) d""",
            cat,
        )
    )


async def drop_namespace(redis: Redis, ns: str) -> None:
    client = target(redis).client(5.0)
    try:
        keys = [k async for k in client.scan_iter(match=f"{ns}:*", count=1000)]
        for i in range(0, len(keys), 500):
            await client.delete(*keys[i : i + 500])  # split per slot on a cluster
    finally:
        await client.aclose()


class HookServer:
    """A real HTTP endpoint on 127.0.0.1 for ``http`` jobs: records each request
    (headers lower-cased) and the moment its head arrived (``arrived``, the
    system clock), and answers ``status(n)`` to the n-th one (from 1)."""

    def __init__(self, status: Callable[[int], int] = lambda n: 204) -> None:
        self.status = status
        self.requests: list[dict[str, str]] = []
        self.arrived: list[datetime] = []
        self.port = 0
        self._server: asyncio.Server | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}/hook"

    async def __aenter__(self) -> HookServer:
        self._server = await asyncio.start_server(self._serve, "127.0.0.1", 0)
        self.port = int(self._server.sockets[0].getsockname()[1])
        return self

    async def __aexit__(self, *exc: object) -> None:
        if self._server is not None:
            self._server.close()
            await self._server.wait_closed()

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            head = (await reader.readuntil(b"\r\n\r\n")).decode()
            arrived = datetime.now(UTC)
            request_line, *lines = head.split("\r\n")
            headers = {":request": request_line}
            for line in lines:
                name, sep, value = line.partition(":")
                if sep:
                    headers[name.strip().lower()] = value.strip()
            await reader.readexactly(int(headers.get("content-length", "0")))
            self.requests.append(headers)
            self.arrived.append(arrived)
            status = self.status(len(self.requests))
            writer.write(
                f"HTTP/1.1 {status} X\r\ncontent-length: 0\r\nconnection: close\r\n\r\n".encode()
            )
            await writer.drain()
        except (asyncio.IncompleteReadError, ConnectionError):
            pass
        finally:
            writer.close()


class OwnRedis:
    """A private redis-server (no persistence) this test may flush and restart."""

    def __init__(self) -> None:
        self.port = free_port()
        self.dir = tempfile.mkdtemp(prefix="sched-redis-")
        self.proc: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    def start(self) -> None:
        self.proc = subprocess.Popen(
            [
                "redis-server",
                "--port",
                str(self.port),
                "--bind",
                "127.0.0.1",
                "--save",
                "",
                "--appendonly",
                "no",
                "--dir",
                self.dir,
            ],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            with (
                contextlib.suppress(OSError),
                socket.create_connection(("127.0.0.1", self.port), 0.2),
            ):
                return
            time.sleep(0.05)
        raise RuntimeError("redis-server did not start")

    def stop(self) -> None:
        if self.proc is not None:
            self.proc.kill()
            self.proc.wait()
            self.proc = None


@contextmanager
def own_redis() -> Iterator[OwnRedis]:
    r = OwnRedis()
    r.start()
    try:
        yield r
    finally:
        r.stop()
        shutil.rmtree(r.dir, ignore_errors=True)
