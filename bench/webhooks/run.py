"""Webhooks out, end to end: outbox -> webhooks consumer (fan-out) ->
scheduler jobs ``webhooks.deliver`` -> real local HTTP subscribers.

The service side (relay and scheduler, as ``reservo worker --roles relay,scheduler``
runs them) is this process; the subscribers are a child process (an asyncio
HTTP server on many ports) that records, per port, each delivery's latency:
its arrival less the event's CloudEvents ``time``.

Two measures:

- ``throughput``: N events for ONE fast endpoint, written to the outbox
  first; deliveries per second from the workers' start to the last arrival.
- ``dead``: 100 endpoints subscribed to the same events, events emitted at a
  steady rate; the live endpoints' delivery latency (p50/p99) with all 100
  alive, then with one of them never answering (each attempt waits the 10 s
  timeout). The bound on attempts in flight per endpoint is what keeps the
  other 99 from waiting behind it.

    python bench/webhooks/run.py --events 3000 --rate 20 --seconds 15
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import subprocess
import sys
import time
import uuid
from datetime import datetime
from typing import Any

import asyncpg

PG_URL = os.environ.get("BENCH_PG_URL", "postgresql://postgres@127.0.0.1:5432/postgres")
REDIS_URL = os.environ.get("BENCH_REDIS_URL", "redis://127.0.0.1:6379/0")
# Consumed by notifications (a log line) and webhooks only: what is measured
# is the webhooks path, not another consumer parking events it cannot apply.
TOPIC = "appointments.appointment.no-show.v1"
PAYLOAD = {
    "appointmentId": 42,
    "firstAppointmentId": 42,
    "slotId": 7,
    "patientId": 1001,
    "doctorId": 3,
    "startAt": "2030-01-07T09:00:00+00:00",
    "endAt": "2030-01-07T09:30:00+00:00",
}


# -- the subscribers (child process) ---------------------------------------------------


async def subscribers_main(ports: int, dead: int) -> None:
    """Listens on ``ports`` ports (the first ``dead`` never answer), prints the
    ports as JSON, then on stdin's "report" prints the latencies per port."""
    latencies: dict[int, list[float]] = {}

    def serve(port_index: int) -> Any:
        async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            try:
                head = await reader.readuntil(b"\r\n\r\n")
                length = 0
                for line in head.split(b"\r\n"):
                    if line.lower().startswith(b"content-length:"):
                        length = int(line.split(b":", 1)[1])
                body = await reader.readexactly(length)
                if port_index < dead:
                    await asyncio.sleep(3600)
                sent = datetime.fromisoformat(json.loads(body)["time"]).timestamp()
                latencies.setdefault(port_index, []).append(time.time() - sent)
                writer.write(b"HTTP/1.1 204 No Content\r\ncontent-length: 0\r\n\r\n")
                await writer.drain()
            except (asyncio.IncompleteReadError, ConnectionError):
                pass
            finally:
                writer.close()

        return handle

    servers = [await asyncio.start_server(serve(i), "127.0.0.1", 0) for i in range(ports)]
    print(json.dumps([s.sockets[0].getsockname()[1] for s in servers]), flush=True)
    loop = asyncio.get_running_loop()
    while True:
        line = await loop.run_in_executor(None, sys.stdin.readline)
        if not line or line.strip() == "report":
            print(json.dumps({str(k): v for k, v in latencies.items()}), flush=True)
            latencies.clear()
        if not line or line.strip() == "quit":
            return


class Subscribers:
    def __init__(self, ports: int, dead: int) -> None:
        self.proc = subprocess.Popen(
            [sys.executable, __file__, "--subscribers", str(ports), "--dead", str(dead)],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
        )
        assert self.proc.stdout is not None
        self.ports: list[int] = json.loads(self.proc.stdout.readline())

    def report(self) -> dict[int, list[float]]:
        assert self.proc.stdin is not None and self.proc.stdout is not None
        self.proc.stdin.write("report\n")
        self.proc.stdin.flush()
        return {int(k): v for k, v in json.loads(self.proc.stdout.readline()).items()}

    def close(self) -> None:
        self.proc.kill()
        self.proc.wait()


# -- the service side ------------------------------------------------------------------


async def fresh_database() -> str:
    from reservo.core.db.migrate import migrate

    name = f"bench_webhooks_{uuid.uuid4().hex[:8]}"
    conn = await asyncpg.connect(PG_URL)
    await conn.execute(f'CREATE DATABASE "{name}"')
    await conn.close()
    url = f"{PG_URL.rpartition('/')[0]}/{name}"
    await migrate(url)
    return url


async def drop(url: str) -> None:
    conn = await asyncpg.connect(PG_URL)
    await conn.execute(f'DROP DATABASE IF EXISTS "{url.rpartition("/")[2]}" WITH (FORCE)')
    await conn.close()


def container(url: str, **settings: Any) -> Any:
    from reservo.bootstrap import build
    from reservo.settings import Settings

    return build(
        Settings(
            database_url=url,
            redis_url=REDIS_URL,
            redis_namespace=f"bench-webhooks-{uuid.uuid4().hex[:8]}",
            jwt_secret="bench-" + "x" * 40,
            payments_webhook_secret="bench-" + "y" * 40,
            results_webhook_secret="bench-" + "z" * 40,
            jobs_http_allow="127.0.0.1",
            outbox_poll_interval_s=0.02,
            log_level="WARNING",
            **settings,
        ),
        announce=False,
    )


async def subscribe(c: Any, ports: list[int]) -> None:
    from reservo.webhooks.setup import WebhooksModule

    service = c.module(WebhooksModule).service
    for port in ports:
        await service.create(f"http://127.0.0.1:{port}/hook", [TOPIC], "bench")


async def emit_many(c: Any, n: int) -> None:
    from reservo.core.messaging.outbox import emit

    async with c.db.transaction() as conn:
        for i in range(n):
            await emit(conn, TOPIC, f"appointment:{i}", PAYLOAD, c.clock.now())


async def workers(c: Any, stop: asyncio.Event) -> list[asyncio.Task[Any]]:
    """The roles `reservo worker --roles relay,scheduler` runs."""
    from reservo.bootstrap import run_workers

    return [asyncio.create_task(run_workers(c, ["relay", "scheduler"], stop))]


async def count(c: Any, sql: str) -> int:
    async with c.db.connection() as conn:
        found: int = await conn.fetchval(sql)
    return found


async def until(c: Any, sql: str, n: int) -> float:
    """Seconds until ``sql`` counts ``n`` (polled: the count is in the database)."""
    start = time.monotonic()
    while await count(c, sql) < n:  # noqa: ASYNC110
        await asyncio.sleep(0.05)
    return time.monotonic() - start


async def throughput(events: int) -> dict[str, Any]:
    """The two stages apart: the fan-out (relay, webhooks consumer) of events
    already in the outbox, then the deliveries (scheduler) of the rows it made."""
    from reservo.bootstrap import run_workers

    subs = Subscribers(1, 0)
    url = await fresh_database()
    c = container(url)
    try:
        await subscribe(c, subs.ports)
        await emit_many(c, events)
        stop = asyncio.Event()
        relay = asyncio.create_task(run_workers(c, ["relay"], stop))
        fanned = await until(c, "SELECT count(*) FROM webhook_delivery", events)
        stop.set()
        await relay
        stop = asyncio.Event()
        scheduler = asyncio.create_task(run_workers(c, ["scheduler"], stop))
        delivered = await until(
            c, "SELECT count(*) FROM webhook_delivery WHERE status = 'DELIVERED'", events
        )
        stop.set()
        await scheduler
        subs.report()
        return {
            "events": events,
            "fan_out_events_per_s": round(events / fanned, 1),
            "deliveries_per_s": round(events / delivered, 1),
        }
    finally:
        subs.close()
        await c.close()
        await drop(url)


async def steady(endpoints: int, dead: int, rate: float, seconds: float) -> dict[str, Any]:
    subs = Subscribers(endpoints, dead)
    url = await fresh_database()
    c = container(url)
    try:
        await subscribe(c, subs.ports)
        stop = asyncio.Event()
        tasks = await workers(c, stop)
        await asyncio.sleep(1.0)
        subs.report()  # nothing yet: starts the count here
        sent = 0
        start = time.monotonic()
        while (elapsed := time.monotonic() - start) < seconds:
            due = int(elapsed * rate) + 1
            if due > sent:
                await emit_many(c, due - sent)
                sent = due
            await asyncio.sleep(0.01)
        live = endpoints - dead
        deadline = time.monotonic() + 30
        got: dict[int, list[float]] = {}
        while time.monotonic() < deadline:
            await asyncio.sleep(1.0)
            for k, v in subs.report().items():
                got.setdefault(k, []).extend(v)
            if sum(len(v) for k, v in got.items() if k >= dead) >= sent * live:
                break
        stop.set()
        await asyncio.gather(*tasks)
        lat = sorted(x for k, xs in got.items() if k >= dead for x in xs)
        return {
            "endpoints": endpoints,
            "dead": dead,
            "events": sent,
            "live_deliveries": len(lat),
            "expected": sent * live,
            "p50_s": round(lat[len(lat) // 2], 3) if lat else None,
            "p99_s": round(lat[int(len(lat) * 0.99)], 3) if lat else None,
            "max_s": round(lat[-1], 3) if lat else None,
        }
    finally:
        subs.close()
        await c.close()
        await drop(url)


async def main(args: argparse.Namespace) -> None:
    results: dict[str, Any] = {}
    if "throughput" in args.only:
        results["throughput"] = await throughput(args.events)
        print(json.dumps(results["throughput"]), flush=True)
    if "dead" in args.only:
        for dead in (0, 1):
            r = await steady(100, dead, args.rate, args.seconds)
            results[f"dead={dead}"] = r
            print(json.dumps(r), flush=True)
    print(json.dumps(results, indent=2))


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--events", type=int, default=3000)
    parser.add_argument("--rate", type=float, default=20.0, help="events/s (x100 deliveries)")
    parser.add_argument("--seconds", type=float, default=15.0)
    parser.add_argument("--only", default="throughput,dead")
    parser.add_argument("--subscribers", type=int, default=0, help=argparse.SUPPRESS)
    parser.add_argument("--dead", type=int, default=0, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.subscribers:
        asyncio.run(subscribers_main(args.subscribers, args.dead))
    else:
        asyncio.run(main(args))
