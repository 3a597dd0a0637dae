"""Killing the worker between claim and completion loses nothing.

A real ``reservo worker --roles relay`` process delivers notifications to a tiny
real HTTP server that accepts the connections but never answers: the worker has
claimed the outbox rows and is stuck mid-delivery. It is SIGKILLed there. A second
worker (the server now answering) must, once the lease expires, deliver every
notification exactly once per event and settle every outbox row."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import sys
import uuid
from collections import Counter
from collections.abc import Awaitable, Callable
from pathlib import Path

import asyncpg
import httpx
import pytest

from reservo.app import create_app
from reservo.bootstrap import build
from reservo.core.kernel.clock import OffsetClock
from reservo.settings import Settings
from tests.helpers.appointments import book, make_slots
from tests.helpers.auth import JWT_SECRET, PAY_SECRET, RESULTS_SECRET, auth, new_id

LEASE_S = 2


class Provider:
    """A minimal HTTP/1.1 SMS provider. Until ``answering`` is set it reads each
    request and then stays silent, holding the connection open."""

    def __init__(self) -> None:
        self.answering = False
        self.hung: list[str] = []  # event ids received and never answered
        self.answered: Counter[str] = Counter()  # event ids answered 200
        self.port = 0
        self._server: asyncio.Server | None = None
        self._writers: set[asyncio.StreamWriter] = set()

    async def start(self) -> None:
        self._server = await asyncio.start_server(self._serve, "127.0.0.1", 0)
        self.port = int(self._server.sockets[0].getsockname()[1])

    async def stop(self) -> None:
        if self._server is not None:
            self._server.close()
            for w in list(self._writers):
                w.transport.abort()
            await self._server.wait_closed()

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self._writers.add(writer)
        try:
            while True:  # keep-alive: several requests per connection
                head = await reader.readuntil(b"\r\n\r\n")
                length = 0
                for line in head.decode("latin-1").split("\r\n"):
                    name, _, value = line.partition(":")
                    if name.strip().lower() == "content-length":
                        length = int(value.strip())
                body = json.loads(await reader.readexactly(length))
                event_id = str(body["eventId"])
                if not self.answering:
                    self.hung.append(event_id)
                    await reader.read()  # silent until the client goes away
                    return
                self.answered[event_id] += 1
                writer.write(
                    b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\n"
                    b"Content-Length: 2\r\n\r\n{}"
                )
                await writer.drain()
        except (asyncio.IncompleteReadError, ConnectionError):
            pass
        finally:
            self._writers.discard(writer)
            writer.transport.abort()


async def _start_worker(env: dict[str, str], log: Path) -> asyncio.subprocess.Process:
    exe = Path(sys.executable).with_name("reservo")
    cmd = [str(exe)] if exe.exists() else [sys.executable, "-m", "reservo.cli"]
    with log.open("ab") as out:
        return await asyncio.create_subprocess_exec(
            *cmd, "worker", "--roles", "relay", env=env, stdout=out, stderr=out
        )


async def _until(
    what: str, check: Callable[[], Awaitable[bool]], timeout_s: float, logs: list[Path]
) -> None:
    """Poll ``check`` (a database or server state, no event to wait on) with a bound."""
    try:
        async with asyncio.timeout(timeout_s):
            while True:
                if await check():
                    return
                await asyncio.sleep(0.05)
    except TimeoutError:
        tails = "\n".join(f"--- {p.name}\n{p.read_text()[-3000:]}" for p in logs if p.exists())
        pytest.fail(f"timed out waiting for {what}\n{tails}")


async def test_killing_the_worker_mid_delivery_loses_nothing(
    own_database: str, base_settings: Settings, redis_url: str, tmp_path: Path
) -> None:
    # 1. Events through the real HTTP API: 6 bookings, 2 of them cancelled.
    # Own database, so own Redis namespace too: ids restart at 1 here, and the
    # session namespace may already hold "full" marks for slot ids of the shared DB.
    namespace = f"{base_settings.redis_namespace}-crash-{uuid.uuid4().hex[:8]}"
    settings = base_settings.with_(database_url=own_database, redis_namespace=namespace)
    container = build(settings, OffsetClock())
    patients = [new_id() for _ in range(6)]
    try:
        app = create_app(container, owns_container=False)
        async with httpx.AsyncClient(
            transport=httpx.ASGITransport(app=app), base_url="http://reservo.test"
        ) as client:
            _, slots = await make_slots(client, capacity=2)
            appts = []
            for i, patient in enumerate(patients):
                r = await book(client, slots[i // 2]["id"], patient)
                assert r.status_code == 201, r.text
                appts.append(r.json()["id"])
            for appt, patient in zip(appts[:2], patients[:2], strict=True):
                r = await client.delete(
                    f"/api/appointments/{appt}", headers=auth("patient", patient)
                )
                assert r.status_code == 200, r.text
    finally:
        await container.close()

    db = await asyncpg.connect(own_database)
    provider = Provider()
    await provider.start()
    workers: list[asyncio.subprocess.Process] = []
    logs = [tmp_path / "worker1.log", tmp_path / "worker2.log"]
    try:
        events = await db.fetch("SELECT event_id, payload::text AS payload FROM outbox")
        assert len(events) == 8
        env = {
            **os.environ,
            "RESERVO_DATABASE_URL": own_database,
            "RESERVO_REDIS_URL": redis_url,
            "RESERVO_REDIS_NAMESPACE": namespace,
            "RESERVO_OUTBOX_LEASE_S": str(LEASE_S),
            "RESERVO_OUTBOX_POLL_INTERVAL_S": "0.1",
            "RESERVO_NOTIFY_CHANNEL": "http",
            "RESERVO_NOTIFY_HTTP_URL": f"http://127.0.0.1:{provider.port}/sms",
            # Far longer than the test waits: worker 1 must be stuck, not timing out.
            "RESERVO_NOTIFY_TIMEOUT_S": "60",
            "RESERVO_LOG_JSON": "false",
            "RESERVO_JWT_SECRET": JWT_SECRET,
            "RESERVO_PAYMENTS_WEBHOOK_SECRET": PAY_SECRET,
            "RESERVO_RESULTS_WEBHOOK_SECRET": RESULTS_SECRET,
        }

        # 2. Worker 1 claims everything and hangs on the silent provider. Events of
        # one appointment go in order, so one request per appointment is in flight.
        workers.append(await _start_worker(env, logs[0]))

        async def all_in_flight() -> bool:
            return len(provider.hung) == len(appts)

        await _until("worker 1 to be stuck mid-delivery", all_in_flight, 30, logs)
        claimed = await db.fetch("SELECT status, attempts, locked_until FROM outbox")
        assert all(r["status"] == "PENDING" and r["attempts"] == 1 for r in claimed)
        assert all(r["locked_until"] is not None for r in claimed)
        assert await db.fetchval("SELECT count(*) FROM notification WHERE status = 'SENT'") == 0

        # 3. Kill it there: no cleanup, no settling, leases left behind.
        workers[0].send_signal(signal.SIGKILL)
        assert await asyncio.wait_for(workers[0].wait(), 10) == -signal.SIGKILL
        provider.answering = True

        # 4. A second worker takes over once the leases expire.
        workers.append(await _start_worker(env, logs[1]))

        async def all_done() -> bool:
            pending = await db.fetchval("SELECT count(*) FROM outbox WHERE status <> 'DONE'")
            return bool(pending == 0)

        await _until("worker 2 to settle the outbox", all_done, 30, logs)

        outbox = await db.fetch("SELECT event_id, status, attempts FROM outbox")
        notes = await db.fetch("SELECT event_id, recipient, status FROM notification")
    finally:
        for proc in workers:
            if proc.returncode is None:
                proc.terminate()
                try:
                    await asyncio.wait_for(proc.wait(), 10)
                except TimeoutError:
                    proc.kill()
                    await proc.wait()
        await provider.stop()
        await db.close()

    recipient = {str(e["event_id"]): int(json.loads(e["payload"])["patientId"]) for e in events}
    # Every row delivered, each claimed exactly twice: by the dead worker and the new one.
    assert {(r["status"], r["attempts"]) for r in outbox} == {("DONE", 2)}
    # One notification row per event and recipient, all SENT.
    assert sorted((str(n["event_id"]), n["recipient"]) for n in notes) == sorted(recipient.items())
    assert {n["status"] for n in notes} == {"SENT"}
    # The provider answered each event exactly once.
    assert provider.answered == Counter(dict.fromkeys(recipient, 1))
    assert set(provider.hung) <= set(recipient)
    assert "Traceback" not in logs[1].read_text()
