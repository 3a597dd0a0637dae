"""SIGTERM under load against a real ``reservo api`` (one process and
``--workers 2``) and ``reservo up`` (core/http/graceful.py).

A balancer polls /readyz and stops routing to the process a while after it reads
503 (its propagation delay); clients keep sending requests until then. The test
sees /readyz answer 503 ``draining`` while the port still accepts, every request
routed meanwhile served in full (none refused, none cut), then the port close,
and a request that was in flight at that moment (its body still arriving) get
its whole answer after the close."""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass, field
from datetime import date, timedelta
from pathlib import Path

import httpx
import pytest

from reservo.settings import Settings
from tests.helpers.appointments import make_slots
from tests.helpers.auth import ADMIN
from tests.helpers.procs import env_for, free_port, running, wait_http

DRAIN_S = 3.0
# How long the balancer keeps routing here after it read the first 503.
BALANCER_DELAY_S = 1.0
CLIENTS = 8


@dataclass
class Balancer:
    """What the test's load balancer saw on /readyz, and whether it routes here."""

    probes: list[tuple[float, int | str]] = field(default_factory=list)
    first_503: float | None = None
    closed_at: float | None = None
    draining: asyncio.Event = field(default_factory=asyncio.Event)

    def routes(self) -> bool:
        return self.first_503 is None or time.monotonic() < self.first_503 + BALANCER_DELAY_S

    async def poll(self, base: str) -> None:
        """Every 50 ms, on a new connection each time, until the port is closed."""
        async with httpx.AsyncClient(
            base_url=base, timeout=5, limits=httpx.Limits(max_keepalive_connections=0)
        ) as http:
            while True:
                try:
                    r = await http.get("/readyz")
                except httpx.ConnectError:
                    self.closed_at = time.monotonic()
                    self.probes.append((self.closed_at, "refused"))
                    return
                except httpx.TransportError as exc:
                    self.probes.append((time.monotonic(), f"cut: {exc!r}"))
                    continue
                self.probes.append((time.monotonic(), r.status_code))
                if r.status_code == 503:
                    assert r.json()["status"] == "draining", r.text
                    if self.first_503 is None:
                        self.first_503 = time.monotonic()
                        self.draining.set()
                await asyncio.sleep(0.05)


async def _load(
    base: str, path: str, balancer: Balancer, outcomes: list[tuple[float, str]]
) -> None:
    """Requests in a loop while the balancer routes here: (start, outcome) each."""
    async with httpx.AsyncClient(base_url=base, timeout=10, headers=ADMIN) as http:
        while balancer.routes():
            started = time.monotonic()
            try:
                r = await http.get(path)
                outcome = "ok" if r.status_code == 200 else f"status {r.status_code}"
            except httpx.ConnectError:
                outcome = "refused"
            except httpx.TransportError as exc:
                outcome = f"cut: {exc!r}"
            outcomes.append((started, outcome))


async def _in_flight_at_the_close(port: int, balancer: Balancer) -> tuple[bytes, float]:
    """A POST begun shortly before the drain ends, its body sent in parts until
    well after: (the whole answer, when it was read)."""
    await balancer.draining.wait()
    assert balancer.first_503 is not None
    await asyncio.sleep(max(0.0, balancer.first_503 + DRAIN_S - 0.8 - time.monotonic()))
    body = b'{"name": "Dr. Late", "timezone": "Europe/Lisbon"}'
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    head = (
        "POST /api/doctors HTTP/1.1\r\nHost: reservo.test\r\n"
        f"Authorization: {ADMIN['Authorization']}\r\nContent-Type: application/json\r\n"
        f"Content-Length: {len(body)}\r\n\r\n"
    )
    writer.write(head.encode())
    for i in range(0, len(body), 5):  # over about 2.5 s
        writer.write(body[i : i + 5])
        await writer.drain()
        await asyncio.sleep(0.25)
    answer = await asyncio.wait_for(reader.read(), 15)  # until the server closes
    writer.close()
    return answer, time.monotonic()


@pytest.mark.parametrize(
    "command", [["api"], ["api", "--workers", "2"], ["up"]], ids=["api", "api-2-workers", "up"]
)
async def test_sigterm_drains_then_stops_without_cutting_a_request(
    base_settings: Settings, tmp_path: Path, command: list[str]
) -> None:
    port = free_port()
    base = f"http://127.0.0.1:{port}"
    env = env_for(base_settings, RESERVO_HTTP_DRAIN_S=str(DRAIN_S))
    log = tmp_path / "api.log"
    with running([*command, "--port", str(port)], env, log) as proc:
        await asyncio.to_thread(wait_http, f"{base}/readyz", proc, log, 60)
        async with httpx.AsyncClient(base_url=base, timeout=10) as http:
            doctor, slots = await make_slots(http)
            assert slots
            assert (await http.head("/readyz")).status_code == 200
        day = (date.today() + timedelta(days=2)).isoformat()
        path = f"/api/doctors/{doctor}/slots?date={day}"

        balancer = Balancer()
        outcomes: list[tuple[float, str]] = []
        polling = asyncio.create_task(balancer.poll(base))
        load = [asyncio.create_task(_load(base, path, balancer, outcomes)) for _ in range(CLIENTS)]
        late = asyncio.create_task(_in_flight_at_the_close(port, balancer))
        await asyncio.sleep(1.0)  # under load
        sigterm_at = time.monotonic()
        proc.terminate()
        await asyncio.wait_for(asyncio.gather(polling, *load), 60)
        answer, answered_at = await asyncio.wait_for(late, 30)
        await asyncio.to_thread(proc.wait, 30)

    where = log.read_text()
    # Readiness went 200 -> 503 (draining) while the port still accepted, then
    # the port closed, no sooner than the drain.
    assert balancer.first_503 is not None and balancer.closed_at is not None, balancer.probes
    draining = [
        s
        for t, s in balancer.probes
        # The one connection made in the very instant the port closes, not
        # accepted yet, is reset (as with any server): the balancer, which stopped
        # routing here during the drain, only probes it.
        if balancer.first_503 <= t < balancer.closed_at - 0.05
    ]
    assert len(draining) >= 5 and set(draining) == {503}, balancer.probes
    assert balancer.closed_at - sigterm_at >= DRAIN_S - 0.2, (sigterm_at, balancer.probes)
    # Every request routed here got a full answer: none refused, none cut, and
    # the process kept serving after SIGTERM.
    failed = [o for _, o in outcomes if o != "ok"]
    assert not failed, (failed[:5], where)
    assert sum(1 for t, _ in outcomes if t > balancer.first_503) > 0
    # The request in flight when the port closed was answered in full after it.
    assert answer.startswith(b"HTTP/1.1 201 "), (answer, where)
    assert b"Dr. Late" in answer and b"connection: close" in answer.lower()
    assert answered_at > balancer.closed_at
    assert proc.poll() is not None
