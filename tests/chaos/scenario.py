"""A chaos scenario: the world it runs in, the load it keeps up while a fault is
injected, the checks once it is healed. Shared by test_chaos.py and test_failover.py."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field

import asyncpg
import httpx
import pytest

from tests.chaos import report
from tests.chaos.checks import NO_SERVER_ERRORS, Checks, Result
from tests.chaos.fakes import HttpRecorder, SmtpRecorder
from tests.chaos.load import (
    ADMIN,
    Client,
    Fixtures,
    Ledger,
    Traffic,
    new_matches,
    post_results,
    run_load,
)
from tests.chaos.stack import Infra, Reservo

# Bounds: how long the load runs after the faults are healed, and how long the
# work may take to drain before the checks fail.
TAIL_S = 3.0


DRAIN_S = 90.0


@dataclass
class World:
    infra: Infra
    reservo: Reservo
    smtp: SmtpRecorder
    gateway: HttpRecorder
    recorder: HttpRecorder
    client: Client
    ledger: Ledger
    fx: Fixtures
    db: asyncpg.Connection | None = None
    history: Traffic = field(default_factory=Traffic)

    async def connect(self) -> asyncpg.Connection:
        if self.db is None or self.db.is_closed():
            self.db = await asyncpg.connect(self.infra.database_url)
        return self.db

    async def checks(self) -> list[Result]:
        try:
            db = await self.connect()
            checker = Checks(db, self.ledger, self.history, self.smtp, self.gateway, self.recorder)
            return [await check() for check in checker.all()]
        except (OSError, asyncpg.PostgresError, asyncpg.InterfaceError) as exc:
            self.db = None
            return [Result("database reachable for the checks", False, repr(exc))]

    async def drained(self, bound_s: float) -> tuple[list[Result], float]:
        """Poll the checks until they all pass or ``bound_s`` passes. What the
        clients were answered cannot change any more: it is not waited for."""
        t0 = time.monotonic()
        while True:
            results = await self.checks()
            settling = [r for r in results if r.name != NO_SERVER_ERRORS]
            if all(r.ok for r in settling) or time.monotonic() - t0 > bound_s:
                return results, time.monotonic() - t0
            await asyncio.sleep(1)


def _failures(results: list[Result]) -> str:
    return "\n".join(f"FAILED {r.name}: {r.detail}" for r in results if not r.ok)


def _merge(into: Traffic, t: Traffic) -> None:
    into.statuses.update(t.statuses)
    into.refusals.update(t.refusals)
    into.connection_errors += t.connection_errors
    into.server_errors += t.server_errors
    into.unresolved += t.unresolved
    into.bad_503 += t.bad_503


def _accepted(ledger: Ledger) -> int:
    return (
        len(ledger.appointments)
        + len(ledger.appointments_cancelled)
        + len(ledger.holds)
        + len(ledger.payments)
        + len(ledger.rentals_cancelled)
        + len(ledger.deposits)
        + len(ledger.transfers)
        + len(ledger.bets)
        + len(ledger.results)
        + len(ledger.jobs)
    )


Fault = Callable[[World], Awaitable[None]]


async def scenario(w: World, name: str, faults: str, fault: Fault) -> Traffic:
    """Run the load, inject ``fault`` (it returns once healed), let the load run a
    little longer, wait for the work to drain, then check everything."""
    t0 = time.monotonic()
    before = _accepted(w.ledger)
    traffic = w.client.traffic = Traffic()
    await new_matches(w.client, w.fx, count=2, starts_in_s=6)
    stop = asyncio.Event()
    load = asyncio.create_task(
        run_load(w.client, w.ledger, w.fx, w.recorder.port, stop, concurrency=5)
    )
    results_posted = asyncio.create_task(post_results(w.client, w.ledger, w.fx))
    try:
        await fault(w)
        await asyncio.sleep(TAIL_S)
    finally:
        stop.set()
        await asyncio.gather(load, results_posted)
    _merge(w.history, traffic)
    results, drained_s = await w.drained(DRAIN_S)
    row = report.Row(
        scenario=name,
        faults=faults,
        accepted=_accepted(w.ledger) - before,
        answered_503=traffic.statuses[503],
        connection_errors=traffic.connection_errors,
        server_errors=sum(n for s, n in traffic.statuses.items() if s >= 500 and s != 503),
        drained_s=drained_s,
        checks=[(r.name, r.ok, r.detail) for r in results],
        seconds=time.monotonic() - t0,
    )
    report.ROWS.append(row)
    print(f"\n[chaos] {name}: {faults}")
    for r in results:
        print(f"  {'ok    ' if r.ok else 'FAILED'} {r.name}: {r.detail}")
    assert all(r.ok for r in results), f"{name}:\n{_failures(results)}"
    return traffic


async def _ready(w: World, name: str) -> None:
    await asyncio.to_thread(w.reservo.wait_ready, name)


async def healed(w: World, bound_s: float = 20) -> None:
    """What an operator sees once it is over, with no SQL: both APIs ready
    (PostgreSQL, Redis and Kafka answer), an empty backlog, no dead letters."""
    deadline = time.monotonic() + bound_s
    seen: list[object] = []
    async with httpx.AsyncClient(timeout=3) as http:
        while time.monotonic() < deadline:
            try:
                seen = [(await http.get(f"{u}/readyz")) for u in w.reservo.api_urls]
                letters = await http.get(
                    f"{w.reservo.api_urls[0]}/api/ops/dead-letters", headers=ADMIN
                )
            except httpx.TransportError as exc:
                seen = [exc]
                await asyncio.sleep(0.5)
                continue
            bodies = [r.json() for r in seen if isinstance(r, httpx.Response)]
            if (
                # "ok": ready and nothing degraded (Redis and Kafka answer too).
                all(b.get("status") == "ok" for b in bodies)
                and all(
                    b["backlog"]["outboxPending"] == 0
                    and b["backlog"]["deadEvents"] == 0
                    and b["backlog"]["deadLetters"] == 0
                    for b in bodies
                )
                and letters.status_code == 200
                and letters.json()["items"] == []
            ):
                return
            seen.append(letters)
            await asyncio.sleep(0.5)
    pytest.fail(f"not healed after {bound_s} s: {[getattr(r, 'text', r) for r in seen]}")
