"""CPU per request, in one process: the storm's refused booking, a cached slot
list and the bare FastAPI hello, driven through each app's ASGI entry (no
server, no socket), measured with the process's own CPU time.

On a machine shared with other work the whole-stack rates of run.py vary
several-fold from run to run; the CPU a request costs this process does not
depend on who else runs. The server's share (uvicorn's protocol) is the same
for every request and is not in these figures.

    python bench/booking_storm/cpu.py --requests 20000 --rounds 3
    python bench/booking_storm/cpu.py --profile storm   # cProfile of the refusals

Instructions instead of seconds (the same count whatever else the machine does;
two sizes, so that start-up and warm-up cancel out): run under callgrind with
``--kinds storm --rounds 1`` at ``--requests 300`` and ``1300``, and divide the
difference of the two totals by 1,000 (docs/BENCHMARKS.md, "Instructions per
request").

Kinds: ``hello`` (the floor), ``storm`` (POST /api/appointments refused 409
slot_full by the Redis gate, 20,000 patients' tokens), ``reads`` (a slot list
from the per-process copy) and ``redis`` (the same list from Redis: the
per-process copy off, as for most uniform reads).

Needs PostgreSQL and Redis (RESERVO_BENCH_DATABASE_URL, RESERVO_BENCH_REDIS_URL,
defaulting to the local ones); a database of its own is created and dropped.
"""

from __future__ import annotations

import argparse
import asyncio
import cProfile
import math
import pstats
import random
import statistics
import sys
import time
import uuid
from collections.abc import Awaitable, Callable
from datetime import timedelta
from pathlib import Path
from typing import Any

import asyncpg
import httpx
from starlette.types import ASGIApp, Message

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "src"))
sys.path.insert(0, str(ROOT / "bench"))

from benchlib import doctor_day  # noqa: E402
from hello_app import app as hello_app  # noqa: E402
from reservo.app import create_app  # noqa: E402
from reservo.bootstrap import build  # noqa: E402
from reservo.core.db.migrate import migrate  # noqa: E402
from reservo.core.http.auth import mint_token  # noqa: E402
from reservo.core.kernel.clock import SystemClock  # noqa: E402
from reservo.settings import Settings  # noqa: E402

SECRET = "bench-secret-for-reservo-cpu-0123456789"
PATIENTS = 20_000  # as the storm: each request its own patient's token
CONCURRENCY = 64  # requests in flight, as wrk's connections to one worker


def _scope(method: str, path: str, query: bytes, headers: list[tuple[bytes, bytes]]) -> Any:
    return {
        "type": "http",
        "asgi": {"version": "3.0"},
        "http_version": "1.1",
        "method": method,
        "scheme": "http",
        "path": path,
        "raw_path": path.encode(),
        "root_path": "",
        "query_string": query,
        "headers": headers,
        "client": ("127.0.0.1", 40000),
        "server": ("127.0.0.1", 8000),
        "state": {},
    }


Request = tuple[str, str, bytes, list[tuple[bytes, bytes]], bytes]


async def drive(app: ASGIApp, requests: list[Request], statuses: dict[int, int]) -> None:
    """Every request through ``app``, CONCURRENCY at a time."""
    queue = iter(requests)

    async def one(req: Request) -> None:
        method, path, query, headers, body = req
        sent = False

        async def receive() -> Message:
            nonlocal sent
            if not sent:
                sent = True
                return {"type": "http.request", "body": body, "more_body": False}
            await asyncio.Event().wait()
            raise AssertionError

        async def send(message: Message) -> None:
            if message["type"] == "http.response.start":
                statuses[message["status"]] = statuses.get(message["status"], 0) + 1

        await app(_scope(method, path, query, headers), receive, send)

    async def worker() -> None:
        for req in queue:
            await one(req)

    await asyncio.gather(*(worker() for _ in range(CONCURRENCY)))


async def measure(
    app: ASGIApp, requests: list[Request], profile: cProfile.Profile | None = None
) -> tuple[float, dict[int, int]]:
    """Microseconds of this process's CPU per request, and the statuses."""
    statuses: dict[int, int] = {}
    if profile is not None:
        profile.enable()
    cpu = time.process_time()
    await drive(app, requests, statuses)
    spent = time.process_time() - cpu
    if profile is not None:
        profile.disable()
    return spent / len(requests) * 1e6, statuses


async def _setup_db(admin_url: str) -> str:
    name = f"reservo_cpu_{uuid.uuid4().hex[:10]}"
    conn = await asyncpg.connect(admin_url)
    await conn.execute(f'CREATE DATABASE "{name}"')
    await conn.close()
    url = admin_url.rpartition("/")[0] + f"/{name}"
    await migrate(url)
    return url


async def _drop_db(admin_url: str, url: str) -> None:
    conn = await asyncpg.connect(admin_url)
    await conn.execute(f'DROP DATABASE IF EXISTS "{url.rpartition("/")[2]}" WITH (FORCE)')
    await conn.close()


def _bearer(role: str, sub: int) -> bytes:
    now = SystemClock().now()
    return b"Bearer " + mint_token(SECRET, role, sub, timedelta(hours=2), now).encode()


async def _full_slots(c: httpx.AsyncClient, n: int) -> tuple[int, str, list[int]]:
    """A doctor, a day, and ``n`` slots of that day booked full (capacity 1)."""
    admin = {"Authorization": _bearer("admin", 1).decode()}
    doctor, day, all_slots = await doctor_day(
        c, admin, name="Dr CPU", tz="Europe/Lisbon", slot_minutes=15, capacity=1
    )
    slots = all_slots[:n]
    for i, slot in enumerate(slots):
        r = await c.post(
            "/api/appointments",
            headers={
                "Authorization": _bearer("patient", 10_000_000 + i).decode(),
                "Idempotency-Key": f"fill-{slot}",
            },
            json={"slotId": slot, "patientId": 10_000_000 + i},
        )
        assert r.status_code == 201, r.text
    return doctor, day, slots


def storm_requests(n: int, slots: list[int], tokens: list[bytes], run: str) -> list[Request]:
    out = []
    for i in range(n):
        p = random.randrange(PATIENTS)
        body = b'{"slotId":%d,"patientId":%d}' % (random.choice(slots), p + 1)
        headers = [
            (b"host", b"bench"),
            (b"authorization", tokens[p]),
            (b"content-type", b"application/json"),
            (b"idempotency-key", f"{run}-{i}".encode()),
            (b"content-length", str(len(body)).encode()),
        ]
        out.append(("POST", "/api/appointments", b"", headers, body))
    return out


def read_requests(n: int, doctor: int, day: str, tokens: list[bytes]) -> list[Request]:
    path, query = f"/api/doctors/{doctor}/slots", f"date={day}".encode()
    return [
        ("GET", path, query, [(b"host", b"bench"), (b"authorization", random.choice(tokens))], b"")
        for _ in range(n)
    ]


def hello_requests(n: int) -> list[Request]:
    return [("GET", "/hello", b"", [(b"host", b"bench")], b"") for _ in range(n)]


async def main(args: argparse.Namespace) -> None:
    admin_url = args.database_url
    url = await _setup_db(admin_url)
    settings = Settings(
        database_url=url,
        redis_url=args.redis_url,
        jwt_secret=SECRET,
        redis_namespace=f"cpu-{uuid.uuid4().hex[:8]}",
        log_json=True,
        payments_webhook_secret="bench-payments-webhook-secret-0123456789",
        results_webhook_secret="bench-results-webhook-secret-0123456789",
        rentals_payment_gateway="sandbox",
    )
    container = build(settings)
    app = create_app(container, owns_container=False)
    # The same data without the per-process copy: every read is a Redis hit,
    # as most uniform reads are (28,000 doctor-days outlive a 1 s local copy).
    remote = build(settings.with_(appointments_slots_local_ttl_s=0.0))
    remote_app = create_app(remote, owns_container=False)
    try:
        await container.db.connect()
        await remote.db.connect()
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://bench") as c:
            doctor, day, slots = await _full_slots(c, 30)
        tokens = [_bearer("patient", p + 1) for p in range(PATIENTS)]
        kinds: dict[str, Callable[[int, int], Awaitable[tuple[float, dict[int, int]]]]] = {}
        profile = cProfile.Profile() if args.profile else None

        async def storm(n: int, r: int) -> tuple[float, dict[int, int]]:
            reqs = storm_requests(n, slots, tokens, f"{uuid.uuid4().hex[:6]}-{r}")
            return await measure(app, reqs, profile if args.profile == "storm" else None)

        async def reads(n: int, r: int) -> tuple[float, dict[int, int]]:
            reqs = read_requests(n, doctor, day, tokens)
            return await measure(app, reqs, profile if args.profile == "reads" else None)

        async def redis(n: int, r: int) -> tuple[float, dict[int, int]]:
            reqs = read_requests(n, doctor, day, tokens)
            return await measure(remote_app, reqs, profile if args.profile == "redis" else None)

        async def hello(n: int, r: int) -> tuple[float, dict[int, int]]:
            return await measure(
                hello_app, hello_requests(n), profile if args.profile == "hello" else None
            )

        kinds = {"hello": hello, "storm": storm, "reads": reads, "redis": redis}
        kinds = {k: v for k, v in kinds.items() if k in args.kinds.split(",")}
        # Warm every path (token cache, local caches, the scripts) first.
        for fn in kinds.values():
            await fn(2000, -1)
        results: dict[str, list[float]] = {k: [] for k in kinds}
        for r in range(args.rounds):
            for name, fn in kinds.items():
                us, statuses = await fn(args.requests, r)
                results[name].append(us)
                print(f"round {r} {name:5s} {us:7.1f} us/request  {dict(sorted(statuses.items()))}")
        print()
        hello_us = statistics.median(results.get("hello") or [math.nan])
        for name, values in results.items():
            med = statistics.median(values)
            runs = ", ".join(f"{v:.0f}" for v in values)
            print(f"{name:5s} median {med:7.1f} us ({runs}); hello/this {hello_us / med:.2f}")
        if profile is not None:
            pstats.Stats(profile).sort_stats(args.sort).print_stats(args.top)
    finally:
        await container.close()
        await remote.close()
        await _drop_db(admin_url, url)


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--requests", type=int, default=20_000)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--kinds", default="hello,storm,reads,redis", help="a comma list")
    parser.add_argument("--profile", choices=["storm", "reads", "redis", "hello"])
    parser.add_argument("--sort", default="tottime")
    parser.add_argument("--top", type=int, default=45)
    parser.add_argument("--database-url", default="postgresql://postgres@127.0.0.1:5432/postgres")
    parser.add_argument("--redis-url", default="redis://127.0.0.1:6379/0")
    try:
        import uvloop

        uvloop.install()
    except ImportError:
        pass
    asyncio.run(main(parser.parse_args()))
