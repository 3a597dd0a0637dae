"""A real ``reservo worker --roles scheduler`` process is SIGKILLed while it runs
an ``http`` job; another worker process reruns it, and it completes once."""

from __future__ import annotations

import asyncio
import os
import signal
import uuid
from datetime import timedelta
from pathlib import Path

import asyncpg

from reservo.settings import Settings
from tests.helpers.procs import env_for, running
from tests.helpers.scheduler import drop_namespace, make
from tests.helpers.waiting import wait_until


class Target:
    """The HTTP endpoint the job calls. Until ``answering`` it reads the request
    and never answers (the job is stuck mid-run); then it answers 200."""

    def __init__(self) -> None:
        self.answering = False
        self.keys: list[str] = []
        self.port = 0
        self._server: asyncio.Server | None = None

    async def start(self) -> None:
        self._server = await asyncio.start_server(self._serve, "127.0.0.1", 0)
        self.port = int(self._server.sockets[0].getsockname()[1])

    async def stop(self) -> None:
        if self._server is not None:
            self._server.close()

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            head = (await reader.readuntil(b"\r\n\r\n")).decode()
            length = 0
            for line in head.split("\r\n"):
                name, _, value = line.partition(":")
                if name.lower() == "idempotency-key":
                    self.keys.append(value.strip())
                if name.lower() == "content-length":
                    length = int(value)
            await reader.readexactly(length)
            if not self.answering:
                await asyncio.sleep(3600)
            writer.write(b"HTTP/1.1 200 OK\r\ncontent-length: 0\r\nconnection: close\r\n\r\n")
            await writer.drain()
        except (asyncio.IncompleteReadError, ConnectionError):
            pass
        finally:
            writer.close()


async def test_sigkilled_worker_job_is_rerun_by_another_and_completes_once(
    base_settings: Settings, database_url: str, db: asyncpg.Connection, tmp_path: Path
) -> None:
    ns = f"kill-{uuid.uuid4().hex[:8]}"
    target = Target()
    await target.start()
    settings = base_settings.with_(redis_namespace=ns)
    env = env_for(
        settings,
        RESERVO_SCHEDULER_LOADER_PERIOD_S="0.2",
        RESERVO_SCHEDULER_HEARTBEAT_S="0.2",
        RESERVO_SCHEDULER_REAPER_TIMEOUT_S="2",
        RESERVO_SCHEDULER_REAPER_PERIOD_S="0.2",
        RESERVO_SCHEDULER_HTTP_TIMEOUT_S="600",
        # The target listens on loopback, which http jobs may only call when allowed.
        RESERVO_JOBS_HTTP_ALLOW="127.0.0.1",
    )
    s = make(database_url, settings.redis_url or "", ns)
    try:
        job = await s.enqueue(
            "http",
            {"url": f"http://127.0.0.1:{target.port}/hook", "body": {"hello": 1}},
            delay=timedelta(milliseconds=300),
        )
        args = ["worker", "--roles", "scheduler"]
        with running(args, env, tmp_path / "a.log") as first:

            async def stuck() -> bool:
                return len(target.keys) == 1

            await wait_until(stuck, 30)
            row = await db.fetchrow("SELECT status, worker FROM scheduled_job WHERE id=$1", job.id)
            assert row["status"] == "RUNNING" and f"-{first.pid}-" in row["worker"]
            os.kill(first.pid, signal.SIGKILL)
            first.wait()
        target.answering = True
        with running(args, env, tmp_path / "b.log"):

            async def done() -> bool:
                return (await s.get(job.id)).status == "DONE"

            await wait_until(done, 30)
            await asyncio.sleep(0.5)
        assert target.keys == [str(job.id), str(job.id)]  # the receiver can dedupe
        log = await s.executions(job.id)
        assert [e["outcome"] for e in log] == ["LOST", "DONE"]
        final = await s.get(job.id)
        assert final.attempts == 2
    finally:
        await target.stop()
        await s.close()
        await drop_namespace(settings.redis_url or "", ns)
