"""The app's own CPU per request, in one process, with no socket.

Each request is one call of the ASGI app as the server makes it (``app(scope,
receive, send)``, on uvloop), so neither the network, nor the HTTP parser, nor the load
generator is in the figure: what is left is the request path itself, beside the
bare FastAPI hello (bench/hello_app.py) called the same way in the same
invocation. Three paths, interleaved run by run:

- ``hello``: the bare FastAPI hello;
- ``copy``: reservo's slot list from the process's own copy (GET
  /api/doctors/{id}/slots with the copy warm): the whole pipeline, auth and
  the route, and no wait;
- ``redis``: the same list from Redis (the process copy off): the same path
  and one wait, for one Redis round trip, alone;
- ``storm``: the booking storm's attempt on a full slot (POST
  /api/appointments, a fresh patient token and Idempotency-Key each, refused
  409 by Redis's "slot full" mark), ``--wave`` callers at a time as under
  load, so their gate checks share one Redis command.

The difference between ``copy`` and ``redis`` is what one wait costs a request
when nothing shares it; ``storm`` is the storm's attempt without the socket,
the parser and the load generator (bench/booking_storm/run.py measures it with
them); ``copy`` beside ``hello`` is what reservo's request path costs beyond
FastAPI's.

    python bench/in_process/run.py --requests 20000 --runs 3
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import sys
import time
from collections.abc import Awaitable, Callable
from datetime import timedelta
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
import uvloop

import benchlib
from hello_app import app as hello_app
from reservo.app import create_app
from reservo.bootstrap import build
from reservo.core.http.auth import mint_token
from reservo.core.kernel.clock import SystemClock
from reservo.settings import Settings

Call = Callable[[], Awaitable[None]]
NOW = SystemClock().now()  # the tokens' issue time


def _scope(path: str, query: bytes, headers: list[tuple[bytes, bytes]]) -> dict[str, Any]:
    return {
        "type": "http", "asgi": {"version": "3.0"}, "http_version": "1.1", "method": "GET",
        "scheme": "http", "path": path, "raw_path": path.encode(), "query_string": query,
        "root_path": "", "headers": [(b"host", b"bench"), *headers],
        "client": ("127.0.0.1", 40000), "server": ("127.0.0.1", 8000), "state": {},
    }  # fmt: skip


def caller(app: Any, path: str, query: bytes, headers: list[tuple[bytes, bytes]]) -> Call:
    """One request to ``app``, its answer checked (200)."""

    async def call() -> None:
        await _request(app, _scope(path, query, headers), b"", 200)

    return call


async def _request(app: Any, scope: dict[str, Any], body: bytes, expected: int) -> None:
    statuses: list[int] = []

    async def receive() -> dict[str, Any]:
        return {"type": "http.request", "body": body, "more_body": False}

    async def send(message: dict[str, Any]) -> None:
        if message["type"] == "http.response.start":
            statuses.append(message["status"])

    await app(scope, receive, send)
    if statuses != [expected]:
        raise SystemExit(f"{scope['method']} {scope['path']}: {statuses}, not {expected}")


def _booking(patient: int, slot_id: int, key: str) -> tuple[dict[str, Any], bytes]:
    """A patient's POST /api/appointments: its scope and body."""
    token = mint_token(benchlib.JWT_SECRET, "patient", patient, timedelta(hours=1), NOW)
    headers = [
        (b"authorization", f"Bearer {token}".encode()),
        (b"content-type", b"application/json"),
        (b"idempotency-key", key.encode()),
    ]
    scope = {**_scope("/api/appointments", b"", headers), "method": "POST"}
    return scope, b'{"slotId":%d,"patientId":%d}' % (slot_id, patient)


def storm_caller(app: Any, slot_id: int, wave: int, total: int) -> Call:
    """``wave`` attempts at the full slot at once, each its own patient and key
    (``total`` of them made beforehand: minting a token is the client's work);
    one call of the result makes ``wave`` requests."""
    patients = range(10**6, 10**6 + total)
    requests = iter([_booking(p, slot_id, f"in-process-{slot_id}-{p}") for p in patients])
    # Out of the collector's way, as the server's own startup objects are
    # (app.py freezes them): the prepared requests are the client's.
    gc.collect()
    gc.freeze()

    async def attempt() -> None:
        scope, body = next(requests)
        await _request(app, scope, body, 409)

    async def call() -> None:
        await asyncio.gather(*(attempt() for _ in range(wave)))

    return call


async def cpu_us(call: Call, requests: int, per_call: int = 1) -> float:
    """CPU microseconds per request over ``requests`` requests (``per_call``
    requests per call), after a warm-up."""
    for _ in range(max(1, 200 // per_call)):
        await call()
    calls = max(1, requests // per_call)
    started = time.process_time()
    for _ in range(calls):
        await call()
    return 1e6 * (time.process_time() - started) / (calls * per_call)


async def full_slot(app: Any) -> int:
    """A future slot of the data set no booking has touched, booked to its
    capacity through ``app``."""
    conn = await benchlib.connect(benchlib.db_url())
    try:
        slot_id, capacity = await conn.fetchrow(
            "SELECT id, capacity FROM time_slot WHERE start_at > now() + interval '1 day'"
            " AND booked_count = 0 ORDER BY id DESC LIMIT 1"
        )
    finally:
        await conn.close()
    for n in range(capacity):
        scope, body = _booking(900_000 + n, slot_id, f"in-process-fill-{slot_id}-{n}")
        await _request(app, scope, body, 201)
    return int(slot_id)


async def reservo_app(local_copy: bool) -> tuple[Any, Callable[[], Awaitable[None]]]:
    """The app over the benchmark database, started (its lifespan), and its stop."""
    settings = Settings(
        database_url=benchlib.db_url(),
        redis_url=benchlib.REDIS_URL,
        redis_namespace=benchlib.NAMESPACE,
        access_log=False,
        **benchlib.SECRET_SETTINGS,  # type: ignore[arg-type]
    )
    if not local_copy:
        own = settings.appointments.model_copy(update={"slots_local_ttl_s": 0.0})
        settings = settings.model_copy(update={"appointments": own})
    app = create_app(build(settings, SystemClock()))
    inbox: asyncio.Queue[dict[str, Any]] = asyncio.Queue()
    outbox: asyncio.Queue[dict[str, Any]] = asyncio.Queue()
    life = asyncio.create_task(app({"type": "lifespan", "state": {}}, inbox.get, outbox.put))
    await inbox.put({"type": "lifespan.startup"})
    started = await outbox.get()
    if started["type"] != "lifespan.startup.complete":
        raise SystemExit(f"reservo did not start: {started}")

    async def stop() -> None:
        await inbox.put({"type": "lifespan.shutdown"})
        await outbox.get()
        await life

    return app, stop


async def measure(opts: argparse.Namespace) -> dict[str, list[float]]:
    ds = await benchlib.ensure_dataset(opts.doctors, opts.days, 40, False)
    path, query = "/api/doctors/5/slots", f"date={ds.first_day + timedelta(days=1)}".encode()
    token = mint_token(benchlib.JWT_SECRET, "patient", 7, timedelta(hours=1), SystemClock().now())
    headers = [(b"authorization", f"Bearer {token}".encode())]
    figures: dict[str, list[float]] = {"hello": [], "copy": [], "redis": [], "storm": []}
    for run in range(opts.runs):
        figures["hello"].append(await cpu_us(caller(hello_app, "/hello", b"", []), opts.requests))
        for name, local_copy in (("copy", True), ("redis", False)):
            app, stop = await reservo_app(local_copy)
            try:
                figures[name].append(await cpu_us(caller(app, path, query, headers), opts.requests))
            finally:
                await stop()
        app, stop = await reservo_app(True)
        try:
            slot_id = await full_slot(app)
            attempts = storm_caller(app, slot_id, opts.wave, opts.requests + 200 + opts.wave)
            figures["storm"].append(await cpu_us(attempts, opts.requests, opts.wave))
        finally:
            await stop()
        print(
            f"[run {run + 1}/{opts.runs}] "
            + ", ".join(f"{k} {v[-1]:.1f} us" for k, v in figures.items()),
            flush=True,
        )
    return figures


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--requests", type=int, default=20000, help="calls per path and run")
    p.add_argument("--runs", type=int, default=3, help="runs (medians reported)")
    p.add_argument("--wave", type=int, default=64, help="storm attempts sent at once")
    p.add_argument("--doctors", type=int, default=2000)
    p.add_argument("--days", type=int, default=14)
    opts = p.parse_args()
    print(benchlib.machine())
    print(f"reservo code under test: {benchlib.reservo_source()}")
    # The servers' loop (uvicorn and granian run reservo on uvloop).
    figures = uvloop.run(measure(opts))
    hello, copy, redis, storm = (
        benchlib.median(figures[k]) for k in ("hello", "copy", "redis", "storm")
    )
    print(f"\nCPU per request, medians of {opts.runs} runs of {opts.requests:,} calls:")
    print(f"  bare FastAPI hello                {hello:7.1f} us")
    print(f"  reservo, slot list from its copy  {copy:7.1f} us  ({copy / hello:.2f} of the hello)")
    print(f"  reservo, slot list from Redis     {redis:7.1f} us  (one wait: +{redis - copy:.1f})")
    print(f"  reservo, storm attempt ({opts.wave} at once) {storm:7.1f} us  ({storm / hello:.2f})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
