"""Outbox relay -> Kafka -> consumer group, end to end.

Writes N outbox rows with bulk SQL into a fresh database, starts an embedded
Tansu broker (or uses BENCH_KAFKA_BOOTSTRAP), then runs R relay processes and C
consumer processes (real OS processes, the same classes `reservo worker` runs).
Consumers apply a trivial idempotent handler: by default its batch form (one
inbox INSERT and one transaction per fetched partition batch, `inbox.once_many`);
`--per-event` runs only the one-transaction-per-event form, for comparison.
Prints rows/s published and consumed end to end, the relay's RSS over the run
(peak and per quarter: flat memory), and CPU seconds per process kind (what
limits it). `--py-spy` adds a 15 s profile of one relay.

    python bench/outbox_relay/run.py --rows 500000 --relays 1 --consumers 2
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import resource
import shutil
import subprocess
import sys
import tempfile
import time
import uuid
from collections import Counter
from pathlib import Path
from typing import Any

import asyncpg
import psutil

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
import benchlib

PG_URL = os.environ.get("BENCH_PG_URL", "postgresql://postgres@127.0.0.1:5432/postgres")
TOPIC = "bench.relay.v1"
CONSUMER = "bench"


def db_url(name: str) -> str:
    return f"{PG_URL.rpartition('/')[0]}/{name}"


# -- child processes ------------------------------------------------------------------


async def relay_main(args: argparse.Namespace) -> None:
    from reservo.core.db.database import Database
    from reservo.core.kernel.clock import SystemClock
    from reservo.core.messaging.outbox import OutboxRelay
    from reservo.core.messaging.transport.kafka import KafkaTransport

    db = Database(args.db, min_size=1, max_size=4)
    transport = KafkaTransport(
        args.bootstrap,
        idempotence=args.idempotence,
        partitions=args.partitions,
        linger_ms=args.linger_ms,
    )
    relay = OutboxRelay(
        db, transport, SystemClock(), batch_size=args.batch, poll_interval_s=0.05, pipelined=True
    )
    await transport.start()
    stop = asyncio.Event()
    running = asyncio.create_task(relay.run(stop))  # the loop `reservo worker` runs
    seen, idle_since = -1, time.monotonic()
    while time.monotonic() - idle_since < 1.0:  # stop once nothing moved for a second
        await asyncio.sleep(0.1)
        if relay.settled_total != seen:
            seen, idle_since = relay.settled_total, time.monotonic()
    stop.set()
    await running
    await transport.stop()
    await db.close()


async def consumer_main(args: argparse.Namespace) -> None:
    from reservo.core.db.database import Database
    from reservo.core.kernel.clock import SystemClock
    from reservo.core.messaging.inbox import once, once_many
    from reservo.core.messaging.transport.base import Event
    from reservo.core.messaging.transport.kafka import KafkaConsumerRunner

    db = Database(args.db, min_size=1, max_size=args.concurrency + 2)

    async def noop(conn: Any) -> None:
        return None

    async def noop_many(conn: Any, events: list[Event]) -> None:
        return None

    async def handle(event: Event) -> None:  # trivial and idempotent (inbox)
        await once(db, CONSUMER, event, noop)

    async def handle_many(events: Any) -> None:
        await once_many(db, CONSUMER, events, noop_many)

    runner = KafkaConsumerRunner(
        args.bootstrap,
        CONSUMER,
        {TOPIC: handle},
        db,
        SystemClock(),
        partitions=args.partitions,
        idempotence=args.idempotence,
        dead_letter_topic=False,
        max_records=2000,
        concurrency=args.concurrency,
        batch_handlers={} if args.per_event else {TOPIC: handle_many},
    )
    stop = asyncio.Event()
    asyncio.get_running_loop().add_signal_handler(15, stop.set)
    await runner.run(stop)
    await db.close()


def child(args: argparse.Namespace) -> None:
    import uvloop

    main = relay_main if args.role == "relay" else consumer_main
    uvloop.run(main(args))
    print(json.dumps({"maxrss_kb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss}))


# -- orchestration --------------------------------------------------------------------


async def prepare(name: str, rows: int, keys: int) -> float:
    from reservo.core.db.migrate import migrate

    admin = await asyncpg.connect(PG_URL)
    await admin.execute(f'CREATE DATABASE "{name}"')
    await admin.close()
    await migrate(db_url(name))
    conn = await asyncpg.connect(db_url(name))
    t0 = time.monotonic()
    await conn.execute(
        """INSERT INTO outbox (event_id, topic, key, payload, created_at, available_at)
           SELECT gen_random_uuid(), $1, 'agg-' || (i % $3),
                  jsonb_build_object('seq', i, 'amount', i % 1000, 'currency', 'EUR',
                                     'note', repeat('x', 120)),
                  now(), now()
             FROM generate_series(1, $2) i""",
        TOPIC,
        rows,
        keys,
    )
    await conn.execute("ANALYZE outbox")
    await conn.close()
    return time.monotonic() - t0


async def counts(conn: asyncpg.Connection) -> tuple[int, int]:
    pending = await conn.fetchval("SELECT count(*) FROM outbox WHERE status = 'PENDING'")
    consumed = await conn.fetchval("SELECT count(*) FROM inbox WHERE consumer = $1", CONSUMER)
    return pending, consumed


def spawn(args: argparse.Namespace, role: str, db: str, bootstrap: str) -> subprocess.Popen[str]:
    cmd = [
        sys.executable,
        __file__,
        "--role",
        role,
        "--db",
        db,
        "--bootstrap",
        bootstrap,
        "--partitions",
        str(args.partitions),
        "--batch",
        str(args.batch),
        "--linger-ms",
        str(args.linger_ms),
        "--concurrency",
        str(args.concurrency),
    ]
    if not args.idempotence:
        cmd.append("--no-idempotence")
    if args.per_event:
        cmd.append("--per-event")
    return subprocess.Popen(cmd, stdout=subprocess.PIPE, text=True)


async def orchestrate(args: argparse.Namespace) -> int:
    from reservo.core.embedded import EmbeddedKafka

    tmp = Path(tempfile.mkdtemp(prefix="bench-kafka-"))
    broker = None
    bootstrap = os.environ.get("BENCH_KAFKA_BOOTSTRAP")
    if not bootstrap:
        broker = EmbeddedKafka(tmp)
        bootstrap = broker.start()
    name = f"reservo_bench_kafka_{uuid.uuid4().hex[:8]}"
    children: list[subprocess.Popen[str]] = []
    try:
        load_s = await prepare(name, args.rows, args.keys)
        print(f"loaded {args.rows} outbox rows in {load_s:.1f}s; broker {bootstrap}")
        conn = await asyncpg.connect(db_url(name))
        consumers = [
            spawn(args, "consumer", db_url(name), bootstrap) for _ in range(args.consumers)
        ]
        await asyncio.sleep(3)  # let the group form before the flood
        t0 = time.monotonic()
        relays = [spawn(args, "relay", db_url(name), bootstrap) for _ in range(args.relays)]
        children += consumers + relays
        relay_ps = psutil.Process(relays[0].pid)
        broker_pid = broker._proc.pid if broker is not None and broker._proc else None
        cpu0 = {
            "pg": benchlib.postgres_cpu_s(),
            "broker": benchlib.cpu_s([broker_pid]),
        }
        profile = None
        if args.py_spy and shutil.which("py-spy"):
            profile = subprocess.Popen(  # noqa: ASYNC220 (fire and forget)
                ["py-spy", "record", "-d", "15", "-r", "50", "-f", "raw", "-o",
                 str(tmp / "relay.txt"), "-p", str(relays[0].pid)],
                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
            )  # fmt: skip
        rss: list[tuple[float, int]] = []
        published_at = consumed_at = None
        relay_cpu = 0.0
        while consumed_at is None or published_at is None:
            await asyncio.sleep(0.25)
            with_time = time.monotonic() - t0
            pending, consumed = await counts(conn)
            if relays[0].poll() is None:
                try:
                    rss.append((args.rows - pending, relay_ps.memory_info().rss))
                    t = relay_ps.cpu_times()
                    relay_cpu = t.user + t.system
                except psutil.NoSuchProcess:
                    pass
            if pending == 0 and published_at is None:
                published_at = with_time
            if consumed >= args.rows and consumed_at is None:
                consumed_at = with_time
            if with_time > args.timeout_s:
                print(f"TIMEOUT pending={pending} consumed={consumed}")
                return 1
        cons_cpu = benchlib.cpu_s([c.pid for c in consumers])
        cpu1 = {
            "pg": benchlib.postgres_cpu_s(),
            "broker": benchlib.cpu_s([broker_pid]),
        }
        for c in consumers:
            c.terminate()
        outs = [json.loads(p.communicate(timeout=60)[0].strip().splitlines()[-1]) for p in relays]
        for c in consumers:
            c.communicate(timeout=60)
        dupes = await conn.fetchval(
            "SELECT count(*) - count(DISTINCT event_id) FROM inbox WHERE consumer = $1", CONSUMER
        )
        done = await conn.fetchval("SELECT count(*) FROM outbox WHERE status = 'DONE'")
        await conn.close()
        assert published_at is not None and consumed_at is not None
        print(f"rows {args.rows}  relays {args.relays}  consumers {args.consumers}  "
              f"partitions {args.partitions}  batch {args.batch}  keys {args.keys}  "
              f"handler {'per event' if args.per_event else 'batch'}")  # fmt: skip
        print(f"published (all rows DONE): {published_at:.1f}s = "
              f"{args.rows / published_at:,.0f} rows/s")  # fmt: skip
        print(f"consumed end to end (inbox rows): {consumed_at:.1f}s = "
              f"{args.rows / consumed_at:,.0f} rows/s")  # fmt: skip
        print(f"outbox DONE {done}/{args.rows}; duplicate handler effects {dupes}")
        quarters = [rss[min(len(rss) - 1, int(len(rss) * q))] for q in (0.25, 0.5, 0.75)]
        print(
            "relay RSS: peak "
            f"{max(o['maxrss_kb'] for o in outs) / 1024:.0f} MiB (ru_maxrss); sampled at "
            + ", ".join(f"{n:,} rows {b / 2**20:.0f} MiB" for n, b in quarters)
        )
        print(
            f"CPU seconds during the run: relay#1 {relay_cpu:.1f}, consumers {cons_cpu:.1f}, "
            f"postgres {cpu1['pg'] - cpu0['pg']:.1f}, broker {cpu1['broker'] - cpu0['broker']:.1f}"
            f" (wall {consumed_at:.1f}s, 2 cores = {2 * consumed_at:.1f} core-s)"
        )
        if profile is not None:
            profile.wait()
            summarize(tmp / "relay.txt")
        return 0 if done == args.rows and dupes == 0 else 1
    finally:
        for proc in children:  # also on timeout or error: leave no orphan behind
            if proc.poll() is None:
                proc.kill()
                proc.wait()
        admin = await asyncpg.connect(PG_URL)
        await admin.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
        await admin.close()
        if broker is not None:
            broker.stop()
        shutil.rmtree(tmp, ignore_errors=True)


def summarize(raw: Path) -> None:
    """Self time by function from py-spy's collapsed stacks: the top 12."""
    if not raw.exists():
        return
    own: Counter[str] = Counter()
    total = 0
    for line in raw.read_text().splitlines():
        stack, _, n = line.rpartition(" ")
        leaf = stack.split(";")[-1]
        own[leaf.split(" (")[0] + " (" + leaf.rsplit("/", 1)[-1]] += int(n)
        total += int(n)
    print("relay profile (py-spy, self time):")
    for fn, n in own.most_common(12):
        print(f"  {100 * n / total:5.1f}%  {fn}")


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--rows", type=int, default=500_000)
    p.add_argument("--keys", type=int, default=10_000)
    p.add_argument("--relays", type=int, default=1)
    p.add_argument("--consumers", type=int, default=2)
    p.add_argument("--partitions", type=int, default=12)
    p.add_argument("--batch", type=int, default=5000)
    p.add_argument("--linger-ms", type=int, default=5)
    p.add_argument("--concurrency", type=int, default=32)
    p.add_argument("--no-idempotence", dest="idempotence", action="store_false")
    p.add_argument("--per-event", action="store_true", help="no batch handler")
    p.add_argument("--py-spy", action="store_true")
    p.add_argument("--timeout-s", type=float, default=900)
    p.add_argument("--role", choices=["relay", "consumer"])
    p.add_argument("--db")
    p.add_argument("--bootstrap")
    args = p.parse_args()
    if args.role:
        child(args)
        return
    if not os.environ.get("BENCH_KAFKA_BOOTSTRAP"):
        args.idempotence = False  # the embedded Tansu has no idempotent producer
    sys.exit(asyncio.run(orchestrate(args)))


if __name__ == "__main__":
    main()
