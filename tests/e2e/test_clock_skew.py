"""A worker whose clock runs 30 s ahead (libfaketime) takes no decision early:
it does not steal the job a live worker is running (the reaper), starts no job
before its run_at, expires no rental hold before its end. Every process reads
PostgreSQL's clock (core/db/clock.py), not its own; with its own, this worker
reaped the live worker's job at once (run twice), started a job a second
early (the fire-ahead) and expired a hold the moment it was made."""

from __future__ import annotations

import asyncio
import time
import uuid
from datetime import UTC, datetime, timedelta
from pathlib import Path

import asyncpg
import pytest

from reservo.core.kernel.clock import OffsetClock
from reservo.scheduler import Scheduler
from reservo.settings import Settings
from tests.chaos.verified import assert_verified
from tests.helpers.procs import env_for, running
from tests.helpers.rentals import at, client_with, hold, make_car
from tests.helpers.scheduler import drop_namespace, make
from tests.helpers.waiting import wait_until

LIBFAKETIME = Path("/usr/lib/x86_64-linux-gnu/faketime/libfaketime.so.1")
HAS_FAKETIME = LIBFAKETIME.exists()
HAS_FAKETIME = LIBFAKETIME.exists()
SKEW = "+30s"


class Target:
    """The HTTP endpoint the jobs call: records each call's path, Idempotency-Key
    and arrival (this machine's clock, PostgreSQL's too); ``/slow`` answers after
    SLOW_S, anything else at once."""

    def __init__(self) -> None:
        self.calls: list[tuple[str, str, float]] = []
        self.release = asyncio.Event()
        self.port = 0
        self._server: asyncio.Server | None = None

    async def start(self) -> None:
        self._server = await asyncio.start_server(self._serve, "127.0.0.1", 0)
        self.port = int(self._server.sockets[0].getsockname()[1])

    def stop(self) -> None:
        if self._server is not None:
            self._server.close()

    def of(self, path: str) -> list[tuple[str, str, float]]:
        return [c for c in self.calls if c[0] == path]

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            head = (await reader.readuntil(b"\r\n\r\n")).decode()
            arrived = time.time()
            path, key, length = head.split(" ")[1], "", 0
            for line in head.split("\r\n"):
                name, _, value = line.partition(":")
                if name.lower() == "idempotency-key":
                    key = value.strip()
                if name.lower() == "content-length":
                    length = int(value)
            await reader.readexactly(length)
            self.calls.append((path, key, arrived))
            if path == "/slow":
                await self.release.wait()
            writer.write(b"HTTP/1.1 200 OK\r\ncontent-length: 0\r\nconnection: close\r\n\r\n")
            await writer.drain()
        except (asyncio.IncompleteReadError, ConnectionError):
            pass
        finally:
            writer.close()


def skewed(env: dict[str, str]) -> dict[str, str]:
    """``env`` with this process's clock (wall and monotonic) 30 s ahead."""
    return {**env, "LD_PRELOAD": str(LIBFAKETIME), "FAKETIME": SKEW}


async def test_a_worker_30_s_ahead_steals_no_lease_runs_nothing_early_expires_no_hold_early(
    base_settings: Settings, own_database: str, tmp_path: Path
) -> None:
    if not HAS_FAKETIME:
        pytest.skip(f"SKIPPED LOUDLY: no {LIBFAKETIME} (Debian: apt install faketime)")
    ns = f"skew-{uuid.uuid4().hex[:8]}"
    settings = base_settings.with_(database_url=own_database, redis_namespace=ns)
    env = env_for(
        settings,
        RESERVO_SCHEDULER_LOADER_PERIOD_S="0.2",
        RESERVO_SCHEDULER_HEARTBEAT_S="0.2",
        RESERVO_SCHEDULER_REAPER_TIMEOUT_S="2",
        RESERVO_SCHEDULER_REAPER_PERIOD_S="0.2",
        # Claimed a second ahead, started at run_at by the worker's clock.
        RESERVO_SCHEDULER_FIRE_AHEAD_S="1",
        RESERVO_RENTALS_SWEEP_INTERVAL_S="0.2",
        RESERVO_JOBS_HTTP_ALLOW="127.0.0.1",
        # The live worker's call waits as long as the test holds it.
        RESERVO_SCHEDULER_HTTP_TIMEOUT_S="120",
        RESERVO_SCHEDULER_HTTP_DEADLINE_S="120",
    )
    target = Target()
    await target.start()
    s = make(own_database, settings.redis_url or "", ns)
    db = await asyncpg.connect(own_database)
    url = f"http://127.0.0.1:{target.port}"
    try:
        # 1. A live, unskewed worker runs a job until released, with no slot for
        # another; the skewed worker starts meanwhile.
        slow = await s.enqueue("http", {"url": f"{url}/slow", "body": {}})
        one_slot = {
            "RESERVO_SCHEDULER_EXECUTORS": "1",
            "RESERVO_SCHEDULER_EXECUTOR_CONCURRENCY": "1",
        }
        with running(
            ["worker", "--roles", "scheduler"], {**env, **one_slot}, tmp_path / "live.log"
        ):
            await wait_until(lambda: bool(target.of("/slow")), 30, "the live worker's call")
            args = ["worker", "--roles", "scheduler,rentals"]
            ahead_log = tmp_path / "skewed.log"
            with running(args, skewed({**env, "RESERVO_LOG_LEVEL": "INFO"}), ahead_log) as ahead:
                await wait_until(
                    lambda: "workers_started" in ahead_log.read_text(), 30, "the skewed worker"
                )
                # 2. Its reaper runs while the live worker's job does; meanwhile it
                # alone can run a job due in 3 s, and sweeps a hold ending in 4 s.
                early = await check_nothing_early(s, db, settings, target, url)
                target.release.set()

                for _ in range(100):  # DONE within 10 s (the call ends at once now)
                    if (await s.get(slow.id)).status == "DONE":
                        break
                    await asyncio.sleep(0.1)
                assert ahead.poll() is None, ahead_log.read_text()
        # The live worker's job was not taken from it: called once, one execution.
        outcomes = [e["outcome"] for e in await s.executions(slow.id)]
        if len(target.of("/slow")) != 1 or outcomes != ["DONE"]:
            early.append(f"the live job was taken: {len(target.of('/slow'))} calls, {outcomes}")
        assert not early, "; ".join(early)
        log = ahead_log.read_text()
        assert "clock_skew" in log, log  # and it said its clock was off
        assert_verified(own_database)
    finally:
        target.stop()
        await db.close()
        await s.close()
        await drop_namespace(settings.redis_url or "", ns)


async def check_nothing_early(
    s: Scheduler, db: asyncpg.Connection, settings: Settings, target: Target, url: str
) -> list[str]:
    """A job due in 3 s and a hold ending in 4 s: what happened early, if anything."""
    run_at = datetime.now(UTC) + timedelta(seconds=3)
    timed = await s.enqueue("http", {"url": f"{url}/timed", "body": {}}, run_at=run_at)
    async for client in client_with(settings, OffsetClock(), rentals_hold_ttl_seconds=4):
        car = await make_car(client)
        r = await hold(client, car["id"], 77_001, at(72), at(96))
        assert r.status_code == 201, r.text
    booking = r.json()["bookingId"]
    ends = await db.fetchval("SELECT hold_expires_at FROM booking WHERE id = $1", booking)
    seen_expired_at: list[datetime] = []

    async def expired() -> bool:
        row = await db.fetchrow("SELECT status, now() AS now FROM booking WHERE id = $1", booking)
        if row["status"] == "EXPIRED":
            seen_expired_at.append(row["now"])
        return bool(seen_expired_at) and bool(target.of("/timed"))

    await wait_until(expired, 20, "the hold EXPIRED and the timed job run", step_s=0.02)
    early: list[str] = []
    started = target.of("/timed")[0][2]
    assert [k for _, k, _ in target.of("/timed")] == [str(timed.id)]
    # Not before run_at (a 20 ms allowance for reading PostgreSQL's clock).
    if started < run_at.timestamp() - 0.02:
        early.append(f"the job started {run_at.timestamp() - started:.3f} s early")
    if seen_expired_at[0] < ends:
        early.append(f"the hold expired {(ends - seen_expired_at[0]).total_seconds():.3f} s early")
    return early
