"""Back-pressure: memory stays flat while PostgreSQL is unreachable under load.

    .venv/bin/python bench/outage_memory/run.py [--outage 60] [--mode refuse|blackhole]
                                                [--workers 2] [--concurrency 64]

Starts `reservo api --workers N` and `reservo worker` as real processes on a
database of its own, reached through a TCP proxy in this process. After a warm-up
with PostgreSQL up, the proxy makes PostgreSQL unreachable for ``--outage``
seconds while ``--concurrency`` clients keep sending bookings, doctor creations
and slot reads without pause: ``refuse`` closes the port (connections refused,
what a stopped server looks like), ``blackhole`` accepts connections and never
answers (a machine gone from the network: every connect waits for its timeout).
The API processes' RSS is sampled every second. Then PostgreSQL comes back and a
write must succeed again.

Checks (non-zero exit when one fails): the API's RSS at the end of the outage
within 10 % (or 8 MB) of its RSS 10 s into it; every request sent during the
outage answered 503 ``unavailable`` with ``Retry-After`` (or 200 without the
database: a cached slot list), never another 5xx; from 1 s into the outage (the
requests under way when it began wait for their statement or connection to
fail) their p99 latency under 1 s, or under the p99 of the same load before the
outage when the machine is that busy; a write succeeds within 10 s of
PostgreSQL's return.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import itertools
import statistics
import sys
import threading
import time
from collections import Counter
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from pathlib import Path

import asyncpg
import httpx
import psutil

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchlib import JWT_SECRET, PG_ADMIN_URL, Reservo, doctor_day, free_port
from reservo.core.db.migrate import migrate
from reservo.core.http.auth import mint_token

DB = "reservo_outage_bench"
PG_HOST, PG_PORT = "127.0.0.1", 5432
GROWTH_LIMIT = 0.10
GROWTH_FLOOR_B = 8 * 1024 * 1024
P99_LIMIT_S = 1.0


class Proxy:
    """A TCP proxy to PostgreSQL on its own event loop (thread): ``up`` forwards,
    ``refuse`` closes the listener and every connection, ``blackhole`` accepts
    and never answers (and cuts what was open, as a lost machine does)."""

    def __init__(self, port: int) -> None:
        self.port = port
        self.mode = "up"
        self.loop = asyncio.new_event_loop()
        self._server: asyncio.Server | None = None
        self._open: set[asyncio.StreamWriter] = set()
        self._pumps: set[asyncio.Task[None]] = set()
        threading.Thread(target=self.loop.run_forever, daemon=True).start()

    def set(self, mode: str) -> None:
        asyncio.run_coroutine_threadsafe(self._set(mode), self.loop).result(10)

    async def _set(self, mode: str) -> None:
        self.mode = mode
        for w in list(self._open):
            w.transport.abort()
        self._open.clear()
        if mode == "refuse" and self._server is not None:
            self._server.close()
            await self._server.wait_closed()
            self._server = None
        elif mode != "refuse" and self._server is None:
            self._server = await asyncio.start_server(
                self._serve, "127.0.0.1", self.port, reuse_address=True
            )

    async def _serve(self, creader: asyncio.StreamReader, cwriter: asyncio.StreamWriter) -> None:
        self._open.add(cwriter)
        if self.mode == "blackhole":
            return  # held open, never answered, until the mode changes
        try:
            ureader, uwriter = await asyncio.open_connection(PG_HOST, PG_PORT)
        except OSError:
            cwriter.transport.abort()
            return
        if self.mode != "up":  # the outage began while this one connected
            cwriter.transport.abort()
            uwriter.transport.abort()
            return
        self._open.add(uwriter)
        for src, dst in ((creader, uwriter), (ureader, cwriter)):
            task = asyncio.create_task(self._pump(src, dst))
            self._pumps.add(task)
            task.add_done_callback(self._pumps.discard)

    async def _pump(self, src: asyncio.StreamReader, dst: asyncio.StreamWriter) -> None:
        try:
            while data := await src.read(65536):
                dst.write(data)
                await dst.drain()
        except OSError:
            pass
        finally:
            self._open.discard(dst)
            dst.transport.abort()


@dataclass
class Tally:
    statuses: Counter[str] = field(default_factory=Counter)
    latencies: list[float] = field(default_factory=list)
    timed: list[tuple[float, float]] = field(default_factory=list)  # (start in outage, s)
    odd: Counter[str] = field(default_factory=Counter)  # anything that breaks a check


async def database() -> str:
    admin = await asyncpg.connect(PG_ADMIN_URL)
    try:
        await admin.execute(f'DROP DATABASE IF EXISTS "{DB}" WITH (FORCE)')
        await admin.execute(f'CREATE DATABASE "{DB}"')
    finally:
        await admin.close()
    url = f"postgresql://postgres@{PG_HOST}:{PG_PORT}/{DB}"
    await migrate(url)
    return url


async def drop_database() -> None:
    admin = await asyncpg.connect(PG_ADMIN_URL)
    try:
        await admin.execute(f'DROP DATABASE IF EXISTS "{DB}" WITH (FORCE)')
    finally:
        await admin.close()


def token(role: str, sub: int) -> dict[str, str]:
    minted = mint_token(JWT_SECRET, role, sub, timedelta(hours=2), datetime.now(UTC))
    return {"Authorization": f"Bearer {minted}"}


async def fixtures(http: httpx.AsyncClient) -> tuple[int, str, list[int]]:
    return await doctor_day(
        http, token("admin", 1), name="Dr. Outage", tz="UTC", slot_minutes=10, capacity=1000
    )


async def client(
    http: httpx.AsyncClient,
    n: int,
    doctor: int,
    day: str,
    slots: list[int],
    stop: asyncio.Event,
    tally: dict[str, Tally],
    phase: list[str],
    phase_started: list[float],
) -> None:
    admin = token("admin", 1)
    for i in itertools.count():
        if stop.is_set():
            return
        kind = ("book", "doctor", "slots")[i % 3]
        patient = 1 + (n * 1_000_003 + i) % 9_000_000
        t0 = time.monotonic()
        started_in = phase[0]
        try:
            if kind == "book":
                r = await http.post(
                    "/api/appointments",
                    json={"slotId": slots[i % len(slots)], "patientId": patient},
                    headers={**token("patient", patient), "Idempotency-Key": f"o-{n}-{i}"},
                )
            elif kind == "doctor":
                r = await http.post(
                    "/api/doctors", json={"name": "Dr. Load", "timezone": "UTC"}, headers=admin
                )
            else:
                r = await http.get(
                    f"/api/doctors/{doctor}/slots", params={"date": day}, headers=admin
                )
        except httpx.HTTPError as exc:
            tally[started_in].odd[f"{kind} {type(exc).__name__}"] += 1
            continue
        outage_at = t0 - phase_started[0] if started_in == "outage" else -1.0
        t = tally[started_in]
        t.latencies.append(time.monotonic() - t0)
        t.timed.append((outage_at, time.monotonic() - t0))
        t.statuses[f"{kind} {r.status_code}"] += 1
        if started_in == "outage":
            if r.status_code == 503:
                if r.json().get("code") != "unavailable" or "retry-after" not in r.headers:
                    t.odd[f"{kind} 503 without unavailable/Retry-After"] += 1
            # A request sent during the outage may be answered after it ended.
            elif not (kind == "slots" and r.status_code == 200) and phase[0] == "outage":
                t.odd[f"{kind} {r.status_code}"] += 1
        elif r.status_code >= 500 and r.status_code != 503:
            t.odd[f"{kind} {r.status_code}"] += 1


def api_rss(reservo: Reservo) -> int:
    assert reservo.api is not None
    top = psutil.Process(reservo.api.pid)
    total = 0
    for p in [top, *top.children(recursive=True)]:
        with contextlib.suppress(psutil.Error):
            total += p.memory_info().rss
    return total


def pct(values: list[float], q: float) -> float:
    if not values:
        return 0.0
    return statistics.quantiles(values, n=100)[q - 1] if len(values) > 1 else values[0]


async def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--outage", type=float, default=60)
    ap.add_argument("--warmup", type=float, default=15)
    ap.add_argument("--mode", choices=["refuse", "blackhole"], default="refuse")
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--concurrency", type=int, default=64)
    args = ap.parse_args()

    await database()
    proxy = Proxy(free_port())
    proxy.set("up")
    url = f"postgresql://postgres@127.0.0.1:{proxy.port}/{DB}"
    env = {"RESERVO_DATABASE_URL": url, "RESERVO_REDIS_NAMESPACE": "bench-outage"}
    failures: list[str] = []
    try:
        with Reservo(args.workers, env) as reservo:
            limits = httpx.Limits(max_connections=args.concurrency)
            async with httpx.AsyncClient(base_url=reservo.base, timeout=30, limits=limits) as http:
                doctor, day, slots = await fixtures(http)
                tally = {p: Tally() for p in ("before", "outage", "after")}
                phase = ["before"]
                phase_started = [0.0]
                stop = asyncio.Event()
                clients = [
                    asyncio.create_task(
                        client(http, n, doctor, day, slots, stop, tally, phase, phase_started)
                    )
                    for n in range(args.concurrency)
                ]
                await asyncio.sleep(args.warmup)
                rss: list[tuple[float, int]] = [(-1.0, api_rss(reservo))]
                proxy.set(args.mode)
                phase_started[0] = time.monotonic()
                phase[0] = "outage"
                t0 = time.monotonic()
                while time.monotonic() - t0 < args.outage:
                    await asyncio.sleep(1)
                    rss.append((time.monotonic() - t0, api_rss(reservo)))
                proxy.set("up")
                phase[0] = "after"
                t_back = time.monotonic()
                back_s = None
                while time.monotonic() - t_back < 30:
                    r = await http.post(
                        "/api/doctors",
                        json={"name": "Dr. Back", "timezone": "UTC"},
                        headers=token("admin", 1),
                    )
                    if r.status_code == 201:
                        back_s = time.monotonic() - t_back
                        break
                    await asyncio.sleep(0.2)
                await asyncio.sleep(3)
                stop.set()
                await asyncio.gather(*clients)
            errors = reservo.error_lines()
    finally:
        proxy.set("refuse")
        await drop_database()

    at10 = next(b for t, b in rss if t >= 10)
    end = rss[-1][1]
    growth = end - at10
    out = tally["outage"]
    answered = sum(out.statuses.values())
    # The requests under way when PostgreSQL went away wait for their statement
    # or connection to fail; what follows is the steady state of the outage.
    settled = [lat for at, lat in out.timed if at >= 1.0]
    first = [lat for at, lat in out.timed if 0 <= at < 1.0]
    p50, p99 = pct(settled, 50), pct(settled, 99)
    mb = 1024 * 1024
    print(
        f"mode {args.mode}, {args.workers} API workers, {args.concurrency} clients, "
        f"outage {args.outage:.0f} s"
    )
    print(
        f"API RSS: before the outage {rss[0][1] / mb:.1f} MB, at 10 s {at10 / mb:.1f} MB, "
        f"at {rss[-1][0]:.0f} s {end / mb:.1f} MB "
        f"(growth {growth / mb:+.1f} MB, {growth / at10:+.1%}); "
        f"max {max(b for _, b in rss) / mb:.1f} MB"
    )
    print("RSS every 10 s (MB): " + " ".join(f"{b / mb:.0f}" for t, b in rss[1::10]))
    print(
        f"during the outage: {answered} answers ({answered / args.outage:.0f}/s), "
        f"from 1 s into it p50 {p50 * 1000:.1f} ms, p99 {p99 * 1000:.1f} ms, "
        f"max {max(settled, default=0) * 1000:.0f} ms; in its first second "
        f"{len(first)} answers, max {max(first, default=0) * 1000:.0f} ms; {dict(out.statuses)}"
    )
    before = tally["before"].latencies
    print(
        f"before (PostgreSQL up): p50 {pct(before, 50) * 1000:.1f} ms, "
        f"p99 {pct(before, 99) * 1000:.1f} ms; {dict(tally['before'].statuses)}"
    )
    print(f"after: {dict(tally['after'].statuses)}")
    print(
        f"a write succeeded {back_s if back_s is None else round(back_s, 2)} s "
        "after PostgreSQL came back"
    )
    if growth > max(GROWTH_LIMIT * at10, GROWTH_FLOOR_B):
        failures.append(f"RSS grew {growth / mb:.1f} MB during the outage")
    # On a shared machine the answers' latency is mostly CPU queueing: the outage
    # must cost no waiting beyond what the same load costs with PostgreSQL up.
    if p99 > max(P99_LIMIT_S, pct(before, 99)):
        failures.append(f"p99 {p99:.2f} s during the outage")
    for name, t in tally.items():
        if t.odd:
            failures.append(f"{name}: {dict(t.odd)}")
    if back_s is None or back_s > 10:
        failures.append("no write within 10 s of PostgreSQL's return")
    if not answered:
        failures.append("nothing answered during the outage")
    if errors:
        print(f"{len(errors)} error lines in the logs, e.g. {errors[:3]}")
    for f in failures:
        print(f"FAIL {f}")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(asyncio.run(main()))
