"""Partitions, not only deaths: reservo's real API and worker in one lab host,
its PostgreSQL in another (tests/chaos/labworld.py), under retrying clients whose
every operation goes into a history, checked afterwards against the database by
a checker that does not import reservo (tests/chaos/history).

- one-way partition: the app still reaches PostgreSQL but hears nothing back
  (``drop_from("app", ["db"])``), so its connections hang rather than fail;
- slow network: 200 ms ± 100 ms each way and 5 % loss between the app and
  PostgreSQL for 60 s (tc netem where the kernel has it, else the userspace
  delay line of tests/chaos/delayline.py plus nftables loss).

Every HTTP attempt must be answered within the request deadline
(RESERVO_HTTP_REQUEST_DEADLINE_S, core/http/deadline.py; without it the slow
network's answers took up to 8.8 s, every statement within its own timeout),
with a 2xx, a deterministic 4xx, a 429 or a 503 (never a 500, never silence);
the pool serves again soon after the heal; the API's memory stays flat; and the
history holds: no acknowledged write lost, nothing applied twice across the
retries, money conserved, no slot over capacity, every accepted job run once.
Figures: docs/CHAOS.md, "Partitions".
"""

from __future__ import annotations

import asyncio
import contextlib
import shutil
import statistics
import time
from collections import Counter
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from dataclasses import dataclass, field

import asyncpg
import pytest

from tests.chaos import netns, report
from tests.chaos.fakes import HttpRecorder
from tests.chaos.histload import Clients, Setup, make_setup
from tests.chaos.history.check import Anomaly, check
from tests.chaos.history.state import read_appointments, read_bank, read_jobs
from tests.chaos.labworld import LINE_PORT, PG_PORT, LabPostgres, LabRedis, LabReservo, temp_root
from tests.chaos.verified import assert_verified

pytestmark = [pytest.mark.partition, pytest.mark.timeout(600)]

ACQUIRE_S, COMMAND_S = 2.0, 3.0
# RESERVO_HTTP_REQUEST_DEADLINE_S: past it a request is answered 503 (core/http/
# deadline.py). The clients measure from their side: the answer may arrive a
# little later on this loaded 2-core machine (the event loops of the API and of
# the test, the lab's veths): SLACK_S.
DEADLINE_S = 5.0
SLACK_S = 0.5
PARTITION_S = 15.0
SLOW_S = 60.0
RECOVER_GOAL_S = 5.0
TAIL_S = 3.0  # the load goes on this long after the heal
CLIENTS = 8
HISTORY = "history: no lost write, no double apply, money, slots, jobs"


@dataclass
class Net:
    lab: netns.Lab
    app: LabReservo
    clients: Clients
    setup: Setup
    receiver: HttpRecorder
    pg: LabPostgres
    line: netns.DelayLine | None
    rss: list[int] = field(default_factory=list)

    async def history_check(self) -> list[Anomaly]:
        db = await asyncpg.connect(self.pg.url(PG_PORT))  # direct: no fault on this path
        try:
            calls = self.receiver.keys("/job/")
            runs = {int(k): n for k, n in calls.items() if k.isdigit()}
            return check(
                self.clients.history,
                await read_bank(db, [a for a, _ in self.setup.accounts]),
                await read_appointments(db, self.setup.slots),
                await read_jobs(db, self.setup.job_prefix, Counter(runs)),
            )
        finally:
            await db.close()

    async def settled(self, bound_s: float) -> list[Anomaly]:
        """The checks, once the jobs accepted have had time to run (at most bound_s)."""
        deadline = time.monotonic() + bound_s
        while True:
            found = await self.history_check()
            if not found or time.monotonic() > deadline:
                return found
            await asyncio.sleep(1)


@contextlib.contextmanager
def _lab() -> Iterator[netns.Lab]:
    why = netns.missing()
    if why:
        pytest.skip(f"SKIPPED LOUDLY: no network lab here: {why}")
    with netns.lab() as lab:
        yield lab


@pytest.fixture(scope="module")
async def net(tmp_path_factory: pytest.TempPathFactory) -> AsyncIterator[Net]:
    with _lab() as lab:
        lab.add("db")
        lab.add("app")
        root = temp_root()
        pg, redis = LabPostgres(lab, "db", root), LabRedis(lab.gateway)
        receiver = HttpRecorder("jobs", host=lab.gateway)
        line = None
        if not netns.has_netem():
            line = lab.delay_line("db", LINE_PORT, f"127.0.0.1:{PG_PORT}", delay_ms=200,
                                  jitter_ms=100)  # fmt: skip
        logs = tmp_path_factory.mktemp("partition")  # kept by pytest: the API's and worker's logs
        app = LabReservo(
            lab, "app", pg.url(PG_PORT if line is None else LINE_PORT), "", lab.gateway, logs,
            extra_env={"RESERVO_DB_ACQUIRE_TIMEOUT_S": str(ACQUIRE_S),
                       "RESERVO_DB_COMMAND_TIMEOUT_S": str(COMMAND_S),
                       "RESERVO_HTTP_REQUEST_DEADLINE_S": str(DEADLINE_S),
                       "RESERVO_DB_POOL_MAX": "10"},
        )  # fmt: skip
        clients: Clients | None = None
        try:
            await asyncio.gather(asyncio.to_thread(pg.start), asyncio.to_thread(redis.start))
            app.redis_url = redis.url
            receiver.listen()
            await asyncio.to_thread(app.migrate)
            await asyncio.to_thread(app.start)
            clients = Clients(app.url, attempt_timeout_s=DEADLINE_S + 10)
            setup = await make_setup(clients, f"http://{lab.gateway}:{receiver.port}")
            yield Net(lab, app, clients, setup, receiver, pg, line)
        finally:
            if clients is not None:
                await clients.aclose()
            receiver.refuse()
            for stop in (app.stop, redis.stop, pg.stop):
                with contextlib.suppress(Exception):
                    stop()
            shutil.rmtree(root, ignore_errors=True)


async def _sample_rss(n: Net, stop: asyncio.Event) -> None:
    while not stop.is_set():
        n.rss.append(n.app.rss_bytes())
        await asyncio.sleep(1)


async def under_load(n: Net, fault: Callable[[], Awaitable[float]]) -> tuple[float, float, float]:
    """The clients run while ``fault`` does its work (it returns the moment it
    healed); they go on TAIL_S more and finish what they started. Returns (start,
    heal, end) on the monotonic clock."""
    stop, sampling = asyncio.Event(), asyncio.Event()
    load = asyncio.create_task(n.clients.run(n.setup, stop, CLIENTS))
    rss = asyncio.create_task(_sample_rss(n, sampling))
    t0 = time.monotonic()
    try:
        await asyncio.sleep(3)
        healed = await fault()
        await asyncio.sleep(TAIL_S)
    finally:
        stop.set()
        await load
        sampling.set()
        await rss
    return t0, healed, time.monotonic()


def recovered_after(n: Net, healed: float) -> float:
    """From the heal to the end of the first write answered 2xx that was sent after it."""
    done = [a.at + a.seconds for a in n.clients.attempts
            if a.at >= healed and a.status is not None and 200 <= a.status < 300]  # fmt: skip
    assert done, "no write succeeded after the heal"
    return min(done) - healed


def retried_across(n: Net, since: float, until: float) -> tuple[int, int]:
    """Writes invoked in the window and acknowledged after more than one attempt;
    of those, how many by a replay (a create answered 200, not 201: an earlier
    attempt had committed, and the retry got its stored answer)."""
    ops = [op for op in n.clients.history.ops if since <= op.invoked_at < until]
    retried = [op for op in ops if op.outcome == "ok" and op.attempts > 1]
    replayed = [op for op in retried if op.kind != "cancel" and op.value.get("status") == 200]
    return len(retried), len(replayed)


def answers(n: Net, since: float, until: float) -> tuple[list[float], dict[int | None, int]]:
    window = [a for a in n.clients.attempts if since <= a.at < until]
    return sorted(a.seconds for a in window), dict(n.clients.statuses(since, until))


def assert_answered(latencies: list[float], statuses: dict[int | None, int]) -> None:
    assert latencies, "no request in the window"
    assert None not in statuses, f"requests left unanswered (timeouts or resets): {statuses}"
    odd = {s: c for s, c in statuses.items() if s is not None and s >= 500 and s != 503}
    assert not odd, f"5xx other than 503: {odd}"
    assert latencies[-1] <= DEADLINE_S + SLACK_S, (
        f"slowest answer {latencies[-1]:.2f} s, over the {DEADLINE_S:.0f} s deadline"
    )


def p99(latencies: list[float]) -> float:
    return statistics.quantiles(latencies, n=100)[98] if len(latencies) > 1 else latencies[0]


def record(name: str, fault: str, n: Net, figures: str, found: list[Anomaly], took: float) -> None:
    counts = n.clients.history.counts()
    statuses = n.clients.statuses()
    report.ROWS.append(
        report.Row(
            scenario=name,
            faults=f"{fault}; {figures}",
            accepted=sum(c for k, c in counts.items() if k.endswith(":ok")),
            answered_503=statuses[503],
            connection_errors=statuses[None],
            server_errors=sum(c for s, c in statuses.items() if s and s >= 500 and s != 503),
            drained_s=0.0,
            checks=[(HISTORY, not found, f"{counts}; anomalies {found[:5]}")],
            seconds=took,
        )
    )
    calls = n.receiver.keys("/job/")
    again = sum(c - 1 for c in calls.values())
    print(f"\n[partition] {name}: {fault}; {figures}; history {counts}; job calls repeated "
          f"with a known id {again}")  # fmt: skip


async def test_one_way_partition_answers_503_in_time_and_loses_nothing(net: Net) -> None:
    n = net
    partitioned: dict[str, float] = {}

    async def fault() -> float:
        partitioned["at"] = time.monotonic()
        n.lab.drop_from("app", ["db"])  # the app sends, never hears back
        await asyncio.sleep(PARTITION_S)
        n.lab.heal()
        return time.monotonic()

    t0, healed, end = await under_load(n, fault)
    latencies, statuses = answers(n, partitioned["at"], healed)
    recovery = recovered_after(n, healed)
    found = await n.settled(30)
    retried, replayed = retried_across(n, partitioned["at"], healed)
    figures = (
        f"{retried} writes acknowledged after retries across it ({replayed} by a replay: "
        "applied during the partition, answer lost), "
        f"{statuses.get(503, 0)} answered 503 during the partition, slowest answer "
        f"{latencies[-1]:.2f} s (deadline {DEADLINE_S:.0f} s), writes back {recovery:.1f} s "
        f"after the heal, lost writes {sum(a.kind == 'lost_write' for a in found)}"
    )
    record("one-way partition", f"app hears nothing from PostgreSQL for {PARTITION_S:.0f} s",
           n, figures, found, end - t0)  # fmt: skip
    assert_answered(latencies, statuses)
    assert statuses.get(503, 0) > 0, "the partition was not felt"
    assert recovery <= RECOVER_GOAL_S
    all_latencies, all_statuses = answers(n, t0, end)
    assert_answered(all_latencies, all_statuses)
    assert not [op for op in n.clients.history.ops if op.outcome is None]
    assert not found, found
    assert_verified(n.pg.url(PG_PORT))


async def test_slow_lossy_network_answers_in_time_with_bounded_memory(net: Net) -> None:
    n = net
    window: dict[str, float] = {}

    async def fault() -> float:
        window["at"] = time.monotonic()
        if n.line is None:
            n.lab.netem("db", delay_ms=200, jitter_ms=100, loss_pct=5)
        else:
            n.lab.netem("db", loss_pct=5)
            n.line.on()
        await asyncio.sleep(SLOW_S)
        n.lab.heal()
        return time.monotonic()

    n.rss.clear()
    t0, healed, end = await under_load(n, fault)
    latencies, statuses = answers(n, window["at"], healed)
    found = await n.settled(30)
    rss_mb = [r / 2**20 for r in n.rss]
    retried, replayed = retried_across(n, window["at"], healed)
    figures = (
        f"{sum(statuses.values())} answers: {statuses}; {retried} writes acknowledged after "
        f"retries ({replayed} by a replay); p50 {statistics.median(latencies):.2f} s,"
        f" p99 {p99(latencies):.2f} s, max {latencies[-1]:.2f} s (deadline {DEADLINE_S:.0f} s);"
        f" API RSS {min(rss_mb):.0f}-{max(rss_mb):.0f} MiB"
        f" ({'tc netem' if n.line is None else 'userspace delay line'} + nftables loss)"
    )
    record("slow network", f"200±100 ms each way + 5 % loss app<->PostgreSQL for {SLOW_S:.0f} s",
           n, figures, found, end - t0)  # fmt: skip
    assert_answered(latencies, statuses)
    assert statuses.get(201, 0) + statuses.get(200, 0) > 0, "nothing got through the slow path"
    assert p99(latencies) <= DEADLINE_S + SLACK_S
    grew = max(rss_mb) - rss_mb[0]
    assert grew < 64, f"the API's memory grew {grew:.0f} MiB: {rss_mb[0]:.0f} -> {max(rss_mb):.0f}"
    assert not found, found
    assert_verified(n.pg.url(PG_PORT))
