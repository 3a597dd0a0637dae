"""The scheduler's promise of an exact time (README: jobs "must run at an exact
future time"; docs/BENCHMARKS.md gives its lateness in milliseconds) under a
posted burst, as users run it: `reservo api --workers 2` and `reservo worker`.

2,000 `http` jobs are posted by 40 concurrent clients (about 250 a second), due
over 8 s starting 6 s after the first post, so the last posts arrive while the
first jobs fire. Each calls back a plain loopback listener (HTTP/1.1, one request
per connection). Every job must arrive once, none before its `runAt`, and the
99th percentile of lateness (arrival minus `runAt`) stay under LATENESS_P99_S:
generous for a loaded CI machine, far below a second."""

from __future__ import annotations

import asyncio
import contextlib
import threading
import time
from collections import Counter
from collections.abc import Iterator
from datetime import UTC, datetime

import httpx
import pytest

from tests.helpers.auth import ADMIN, SERVICE
from tests.helpers.deployment import Deploy

JOBS, CLIENTS = 2_000, 40
POST_RATE = 250.0  # jobs per second, all clients together
# The first due LEAD_S after the first post, the last SPREAD_S later. Posting the
# 2,000 takes 8 s on a fast machine and 18 s on a slow one (this CI's VM): with 14 s
# every job is posted before its runAt there too, and the last posts still
# arrive while the first jobs fire.
LEAD_S, SPREAD_S = 14.0, 8.0
LATENESS_P99_S = 0.5
# How long a worker may take to run its first job once the API answers /readyz.
WORKER_START_S = 60.0


class Listener:
    """An HTTP/1.1 endpoint on 127.0.0.1 in a thread and event loop of its own (the
    test's loop is busy posting): records each request's path and wall-clock
    arrival, answers 204 and closes."""

    def __init__(self) -> None:
        self.arrivals: list[tuple[str, float]] = []
        self.port = 0
        # (the waiting test's loop, its event, how many arrivals it waits for)
        self._waiter: tuple[asyncio.AbstractEventLoop, asyncio.Event, int] | None = None
        self._ready = threading.Event()
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        asyncio.set_event_loop(self._loop)
        server = self._loop.run_until_complete(
            asyncio.start_server(self._serve, "127.0.0.1", 0, backlog=1024)
        )
        self.port = int(server.sockets[0].getsockname()[1])
        self._ready.set()
        self._loop.run_forever()
        server.close()

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            head = await reader.readuntil(b"\r\n\r\n")
            arrived = time.time()
            path = head.split(b" ", 2)[1].decode()
            for line in head.split(b"\r\n"):
                if line.lower().startswith(b"content-length:"):
                    await reader.readexactly(int(line.split(b":", 1)[1]))
            self.arrivals.append((path, arrived))
            if self._waiter is not None and len(self.arrivals) >= self._waiter[2]:
                self._waiter[0].call_soon_threadsafe(self._waiter[1].set)
            writer.write(b"HTTP/1.1 204 No Content\r\nconnection: close\r\n\r\n")
            await writer.drain()
        except (asyncio.IncompleteReadError, ConnectionError):
            pass
        finally:
            writer.close()

    async def wait_for(self, count: int, timeout_s: float) -> None:
        """Until ``count`` requests have arrived, or ``timeout_s`` has passed."""
        arrived = asyncio.Event()
        self._waiter = (asyncio.get_running_loop(), arrived, count)
        if len(self.arrivals) >= count:
            return
        with contextlib.suppress(TimeoutError):  # the test names what is missing
            await asyncio.wait_for(arrived.wait(), max(0.0, timeout_s))

    def __enter__(self) -> Listener:
        self._thread.start()
        self._ready.wait(10)
        return self

    def __exit__(self, *exc: object) -> None:
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(10)


@pytest.fixture
def listener() -> Iterator[Listener]:
    with Listener() as hook:
        yield hook


def _percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


async def test_2000_jobs_posted_in_a_burst_fire_once_on_time(
    deploy: Deploy, listener: Listener
) -> None:
    split = await deploy("split", jobs_http_allow="127.0.0.1")
    # /readyz speaks for the API only: a worker serves no HTTP. Its first job
    # says it is running; the burst measures a running scheduler, and how long
    # the worker took to start is printed apart.
    began = time.time()
    async with httpx.AsyncClient(base_url=split.url, timeout=30) as http:
        r = await http.post(
            "/api/jobs",
            headers=SERVICE,
            json={
                "category": "http",
                "payload": {"url": f"http://127.0.0.1:{listener.port}/probe"},
            },
        )
        assert r.status_code == 201, r.text
    await listener.wait_for(1, WORKER_START_S)
    assert listener.arrivals, f"no job fired {WORKER_START_S:.0f} s after /readyz:\n{split.logs()}"
    print(f"the worker's first job fired {time.time() - began:.1f} s after /readyz")
    start, due = 0.0, list[float]()  # set when the clients are released
    accepted: dict[int, float] = {}  # job -> when its 201 arrived
    run_at: dict[int, float] = {}  # job -> its runAt, as the 201 gave it
    job_ids: dict[int, int] = {}  # job -> the service's id for it
    gate = asyncio.Event()

    async def client(c: int, http: httpx.AsyncClient) -> None:
        await gate.wait()
        for i in range(c, JOBS, CLIENTS):
            # Paced: job i leaves at start + i / POST_RATE, all clients together.
            await asyncio.sleep(max(0.0, start + i / POST_RATE - time.time()))
            r = await http.post(
                "/api/jobs",
                headers=SERVICE,
                json={
                    "category": "http",
                    "runAt": datetime.fromtimestamp(due[i], UTC).isoformat(),
                    "payload": {"url": f"http://127.0.0.1:{listener.port}/job/{i}"},
                },
            )
            assert r.status_code == 201, r.text
            accepted[i] = time.time()
            job_ids[i] = r.json()["jobId"]
            # Lateness is measured from the runAt the service stored and answered.
            run_at[i] = datetime.fromisoformat(r.json()["runAt"].replace("Z", "+00:00")).timestamp()
            assert abs(run_at[i] - due[i]) < 0.001, r.text

    limits = httpx.Limits(max_connections=CLIENTS)
    async with httpx.AsyncClient(base_url=split.url, timeout=30, limits=limits) as http:
        tasks = [asyncio.create_task(client(c, http)) for c in range(CLIENTS)]
        start = time.time()
        due = [start + LEAD_S + SPREAD_S * i / JOBS for i in range(JOBS)]
        gate.set()
        await asyncio.gather(*tasks)
    posting_s = time.time() - start

    await listener.wait_for(JOBS + 1, due[-1] + 20 - time.time())
    await asyncio.sleep(2)  # a job fired twice would arrive by now

    async with httpx.AsyncClient(base_url=split.url, timeout=30, headers=ADMIN) as http:
        # What the service says of the jobs, for a failure's message.
        categories = (await http.get("/api/job-categories")).json()
        unfinished = {}
        for status in ("SCHEDULED", "QUEUED", "RUNNING", "FAILED", "DEAD"):
            query = {"category": "http", "status": status, "limit": 3}
            unfinished[status] = (await http.get("/api/jobs", params=query)).json()["items"]
    state = f"categories: {categories}; not done: {unfinished}"
    # The scenario itself: every job was in the service before its runAt (a box too
    # loaded to post 250 a second fails here, not on the scheduler's account).
    behind = [i for i in range(JOBS) if accepted[i] >= run_at[i]]
    assert not behind, (
        f"{len(behind)} jobs accepted after their runAt (posting took {posting_s:.1f} s)"
    )
    counts = Counter(path for path, _ in listener.arrivals)
    fired: dict[int, float] = {}  # job -> its first call's arrival
    for path, at in listener.arrivals:
        if path.startswith("/job/"):  # the probe, fired twice, is counted below
            fired.setdefault(int(path.rsplit("/", 1)[1]), at)
    missing = sorted(set(range(JOBS)) - set(fired))
    assert not missing, f"{len(missing)} jobs never fired (first {missing[:10]}); {state}"
    twice = {p: n for p, n in counts.items() if n > 1}
    assert not twice, f"fired more than once: {list(twice.items())[:10]}"
    lateness = [fired[i] - run_at[i] for i in range(JOBS)]
    early = [(i, round(late, 4)) for i, late in enumerate(lateness) if late < 0]
    assert not early, f"{len(early)} jobs fired before runAt: {early[:10]}"
    p50, p99 = _percentile(lateness, 0.50), _percentile(lateness, 0.99)
    figures = (
        f"posted {len(accepted)} in {posting_s:.1f} s; lateness p50 {p50 * 1000:.0f} ms, "
        f"p99 {p99 * 1000:.0f} ms, max {max(lateness) * 1000:.0f} ms"
    )
    print(figures)
    if p99 > LATENESS_P99_S:
        figures += await _where_the_time_went(split.url, job_ids, run_at, fired, start)
        figures += f"\n{split.logs()}"
    assert p99 <= LATENESS_P99_S, figures


async def _where_the_time_went(
    url: str,
    job_ids: dict[int, int],
    run_at: dict[int, float],
    fired: dict[int, float],
    start: float,
) -> str:
    """For a failure's message: when the burst's calls arrived, and for the
    latest jobs whether the time was lost before the claim (startedAt late) or
    after it (the call)."""
    first, last = min(fired.values()) - start, max(fired.values()) - start
    lines = [f"; calls arrived {first:.1f}-{last:.1f} s after the burst began"]
    latest = sorted(fired, key=lambda i: fired[i] - run_at[i])[-5:]
    async with httpx.AsyncClient(base_url=url, timeout=30, headers=ADMIN) as http:
        for i in latest:
            job = (await http.get(f"/api/jobs/{job_ids[i]}")).json()
            started = datetime.fromisoformat(job["startedAt"].replace("Z", "+00:00")).timestamp()
            lines.append(
                f"job {i}: started {started - run_at[i]:+.3f} s from its runAt, "
                f"called back {fired[i] - started:+.3f} s after it started"
            )
    return "\n".join(lines)
