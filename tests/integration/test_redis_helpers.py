"""Redis helpers against a real Redis (shared: unique keys, no flush) and, each
test that takes ``client`` or ``gate``, again against a Redis Cluster; plus
private redis-server processes for the outage tests."""

from __future__ import annotations

import asyncio
import contextlib
import signal
import socket
import subprocess
import time
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from typing import TypeVar

import pytest
import redis.exceptions
from prometheus_client import REGISTRY
from redis.crc import key_slot
from structlog.testing import capture_logs

from reservo.core.redis.cache import Cache
from reservo.core.redis.client import Client, RedisGate, ScriptCall, make_client, pipeline
from reservo.core.redis.gate_batch import GateBatch
from reservo.core.redis.ratelimit import Decision, RateLimiter, rate_key
from tests.helpers.procs import free_port
from tests.redis_cluster import RedisTarget

TIMEOUT_S = 0.25
# The behaviour tests' client: what they check is atomicity and answers, not
# timeouts (the outage tests below use TIMEOUT_S), so a loaded machine must not
# make their first connections time out and fail open.
CLIENT_TIMEOUT_S = 5.0
T = TypeVar("T")
pytestmark = pytest.mark.redis_cluster


@pytest.fixture
def ns() -> str:
    return f"test:{uuid.uuid4().hex}"


@pytest.fixture
async def client(redis_target: RedisTarget) -> AsyncIterator[Client]:
    c = redis_target.client(CLIENT_TIMEOUT_S)
    yield c
    await c.aclose()


@pytest.fixture
async def gate(client: Client) -> RedisGate:
    return RedisGate(client, backoff_s=1.0)


# --- a private redis-server we can kill, pause and restart -------------------------


class PrivateRedis:
    def __init__(self) -> None:
        self.port = free_port()
        self.proc: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    def start(self) -> None:
        self.proc = subprocess.Popen(
            [
                "redis-server",
                *("--port", str(self.port), "--bind", "127.0.0.1"),
                *("--save", "", "--appendonly", "no", "--daemonize", "no"),
            ],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        deadline = time.monotonic() + 5
        while time.monotonic() < deadline:
            try:
                with socket.create_connection(("127.0.0.1", self.port), timeout=0.1) as s:
                    s.sendall(b"PING\r\n")
                    if s.recv(16).startswith(b"+PONG"):
                        return
            except OSError:
                pass
            time.sleep(0.02)
        raise RuntimeError("private redis-server did not start")

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGCONT)
            self.proc.kill()
            self.proc.wait(5)
        self.proc = None

    def pause(self) -> None:
        assert self.proc is not None
        self.proc.send_signal(signal.SIGSTOP)

    def resume(self) -> None:
        assert self.proc is not None
        self.proc.send_signal(signal.SIGCONT)


@pytest.fixture
def private_redis() -> Iterator[PrivateRedis]:
    r = PrivateRedis()
    r.start()
    yield r
    r.stop()


async def _timed(coro: Awaitable[T]) -> tuple[T, float]:
    start = time.perf_counter()
    result = await coro
    return result, time.perf_counter() - start


# --- rate limiter -------------------------------------------------------------------


async def test_limiter_admits_exactly_limit_under_concurrency(gate: RedisGate, ns: str) -> None:
    limiter = RateLimiter(gate)
    limit, window_s = 10, 1
    go = asyncio.Event()

    async def one() -> Decision:
        await go.wait()
        return await limiter.hit(ns, 42, limit, window_s)

    tasks = [asyncio.create_task(one()) for _ in range(50)]
    await asyncio.sleep(0.05)  # let every task reach the barrier
    go.set()
    decisions = await asyncio.gather(*tasks)

    allowed = [d for d in decisions if d.allowed]
    denied = [d for d in decisions if not d.allowed]
    assert len(allowed) == limit
    assert sorted(d.remaining for d in allowed) == list(range(limit))
    assert len(denied) == 50 - limit
    assert all(d.retry_after_s >= 1 and d.remaining == 0 for d in denied)

    again = await limiter.hit(ns, 42, limit, window_s)
    assert not again.allowed and again.retry_after_s >= 1

    # The counter is on a hash-tagged key and carries a TTL <= the window.
    key = rate_key(ns, 42)
    assert key == f"reservo:rl:{{{ns}:42}}"
    ttl = await gate.client.pttl(key)
    assert 0 < ttl <= window_s * 1000

    await asyncio.sleep(again.retry_after_s + 0.1)
    after = await limiter.hit(ns, 42, limit, window_s)
    assert after == Decision(allowed=True, remaining=limit - 1, retry_after_s=0)


async def test_limiter_subjects_and_scopes_are_independent(gate: RedisGate, ns: str) -> None:
    limiter = RateLimiter(gate)
    assert (await limiter.hit(ns, "a", 1, 60)).allowed
    assert not (await limiter.hit(ns, "a", 1, 60)).allowed
    assert (await limiter.hit(ns, "b", 1, 60)).allowed
    assert (await limiter.hit(ns + "x", "a", 1, 60)).allowed
    await gate.client.delete(rate_key(ns, "a"), rate_key(ns, "b"), rate_key(ns + "x", "a"))


async def test_limiter_repairs_counter_without_ttl(gate: RedisGate, ns: str) -> None:
    key = rate_key(ns, 1)
    await gate.client.set(key, 5)  # a counter somehow left without a TTL
    d = await RateLimiter(gate).hit(ns, 1, 3, 2)
    assert not d.allowed and 1 <= d.retry_after_s <= 2
    assert 0 < await gate.client.pttl(key) <= 2000
    await gate.client.delete(key)


# --- cache --------------------------------------------------------------------------


async def test_cache_set_get_delete(gate: RedisGate, ns: str) -> None:
    cache = Cache(gate, namespace=ns)
    value = {"slot": 7, "free": [1, 2, 3], "name": "Zoë"}
    assert await cache.get_json("a") is None
    assert await cache.set_json("a", value, 60)
    assert await cache.set_json("b", [1], 60)
    assert await cache.get_json("a") == value
    assert await cache.delete("a", "b", "missing") == 2
    assert await cache.get_json("a") is None
    assert await cache.get_json("b") is None
    assert await cache.delete() == 0


async def test_cache_ttl_expiry(gate: RedisGate, ns: str) -> None:
    cache = Cache(gate, namespace=ns)
    await cache.set_json("k", {"x": 1}, 0.2)
    assert await cache.get_json("k") == {"x": 1}
    await asyncio.sleep(0.35)
    assert await cache.get_json("k") is None


async def test_cache_rejects_bad_input_and_reads_corrupt_as_miss(gate: RedisGate, ns: str) -> None:
    cache = Cache(gate, namespace=ns)
    with pytest.raises(ValueError):
        await cache.set_json("k", 1, 0)
    with pytest.raises(TypeError):
        await cache.set_json("k", object(), 10)
    await gate.client.set(cache.value_key("bad"), b"{not json", px=10_000)
    assert await cache.get_json("bad") is None
    assert gate.available  # a corrupt entry is not an outage
    await cache.delete("bad")


async def test_marks_set_clear_expire(gate: RedisGate, ns: str) -> None:
    cache = Cache(gate, namespace=ns)
    assert not await cache.is_marked("slot:1")
    assert await cache.mark("slot:1", 60)
    assert await cache.is_marked("slot:1")
    assert await cache.clear_mark("slot:1")
    assert not await cache.is_marked("slot:1")
    assert not await cache.clear_mark("slot:1")

    await cache.mark("slot:2", 0.2)
    assert await cache.is_marked("slot:2")
    await asyncio.sleep(0.35)
    assert not await cache.is_marked("slot:2")


async def test_hit_and_check_one_pipeline(
    gate: RedisGate, ns: str, redis_target: RedisTarget
) -> None:
    cache, limiter = Cache(gate, namespace=ns), RateLimiter(gate)
    # One script on a single Redis; on a cluster the keys live in different slots.
    assert cache.cluster == redis_target.cluster
    d, (marked,) = await cache.hit_and_check(limiter, ns, 1, 2, 60, "slot:9")
    assert d == Decision(True, 1, 0) and not marked
    await cache.mark("slot:9", 60)
    d, (marked,) = await cache.hit_and_check(limiter, ns, 1, 2, 60, "slot:9")
    assert d == Decision(True, 0, 0) and marked
    d, (marked,) = await cache.hit_and_check(limiter, ns, 1, 2, 60, "slot:9")
    assert not d.allowed and d.retry_after_s >= 1 and marked
    # Shares the counter with hit().
    assert not (await limiter.hit(ns, 1, 2, 60)).allowed
    await gate.client.delete(rate_key(ns, 1), cache.mark_key("slot:9"))


async def test_pipeline_sends_again_only_what_answered_noscript(client: Client, ns: str) -> None:
    """A script the server does not know yet (restarted, flushed, a replica just
    promoted) is loaded, and only its entries are sent again: the commands
    around them ran once. The keys spread over slots (and a cluster's nodes)."""
    script = client.register_script(f"-- {ns}\nreturn redis.call('INCR', KEYS[1])")
    keys = [f"{ns}:{{k{i}}}" for i in range(6)]
    assert len({key_slot(k.encode()) for k in keys}) == len(keys)
    commands = [ScriptCall(script, [k]) if i % 2 else ("INCR", k) for i, k in enumerate(keys)]
    try:
        assert await pipeline(client, commands) == [1] * 6  # the script was unknown
        assert await pipeline(client, commands) == [2] * 6  # and now is
        assert [int(await client.get(k) or 0) for k in keys] == [2] * 6
    finally:
        for k in keys:
            await client.delete(k)


async def test_pipeline_raises_the_first_error_after_running_the_rest(
    client: Client, ns: str
) -> None:
    keys = [f"{ns}:{{a}}", f"{ns}:{{b}}", f"{ns}:{{c}}"]
    await client.set(keys[1], b"not a number")
    try:
        with pytest.raises(redis.exceptions.ResponseError):
            await pipeline(client, [("INCR", k) for k in keys])
        assert await client.get(keys[0]) == b"1" and await client.get(keys[2]) == b"1"
    finally:
        for k in keys:
            await client.delete(k)


async def test_cluster_scripts_reload_after_script_flush(
    redis_cluster: RedisTarget, ns: str
) -> None:
    """SCRIPT FLUSH on every primary (what a promoted replica looks like): the
    booking gate's pipeline and the limiter load again instead of failing open."""
    client = redis_cluster.client(TIMEOUT_S)
    try:
        gate = RedisGate(client, backoff_s=1.0)
        cache, limiter = Cache(gate, namespace=ns), RateLimiter(gate)
        await client.script_flush()
        await cache.mark("m", 60)
        d, (marked, other) = await cache.hit_and_check(limiter, ns, 1, 5, 60, "m", "n")
        assert d == Decision(True, 4, 0) and marked and not other
        await client.script_flush()
        assert await limiter.hit(ns, 1, 5, 60) == Decision(True, 3, 0)
        await client.script_flush()
        assert await cache.get_versioned("{v}:list") == (None, 0.0, b"0")
        assert gate.available
        await client.delete(rate_key(ns, 1), cache.mark_key("m"))
    finally:
        await client.aclose()


@pytest.fixture
async def single(services: tuple[str, str]) -> AsyncIterator[Client]:
    """A single Redis: the gate's batching is the single-server path (a cluster
    client spreads the same work over a pipeline instead)."""
    c = make_client(services[1], CLIENT_TIMEOUT_S)
    yield c
    await c.aclose()


class CountingGate(RedisGate):
    """A real gate that counts the Redis commands it runs."""

    calls = 0

    async def call(self, fn: Callable[[Client], Awaitable[T]], default: T) -> T:
        self.calls += 1
        return await super().call(fn, default)


async def _released_together(n: int, check: Callable[[int], Awaitable[T]]) -> list[T]:
    """``check(i)`` for i < n, all started in the same turn of the event loop."""
    go = asyncio.Event()

    async def one(i: int) -> T:
        await go.wait()
        return await check(i)

    tasks = [asyncio.create_task(one(i)) for i in range(n)]
    await asyncio.sleep(0)
    go.set()
    return await asyncio.gather(*tasks)


async def test_gate_checks_of_one_loop_turn_go_as_one_command_with_their_own_answers(
    single: Client, ns: str
) -> None:
    gate = CountingGate(single, backoff_s=1.0)
    cache, limiter = Cache(gate, namespace=ns), RateLimiter(gate, namespace=ns)
    await cache.mark("slot:odd", 60)
    await cache.mark("seen:7", 60)
    gate.calls = 0

    def check(i: int) -> Awaitable[tuple[Decision, tuple[bool, ...]]]:
        slot = "slot:odd" if i % 2 else "slot:even"
        return cache.hit_and_check(limiter, "book", i % 3, 10, 60, slot, f"seen:{i}")

    results = await _released_together(90, check)
    assert gate.calls == 1
    for subject in range(3):  # 30 hits on each counter, limit 10: as if one by one
        mine = [d for i, (d, _) in enumerate(results) if i % 3 == subject]
        assert sorted(d.remaining for d in mine if d.allowed) == list(range(10))
        assert all(d.retry_after_s >= 1 for d in mine if not d.allowed)
        assert sum(not d.allowed for d in mine) == 20
    assert [marks for _, marks in results] == [(i % 2 == 1, i == 7) for i in range(90)]
    await cache.hit_and_check(limiter, "book", 0, 10, 60, "slot:odd")  # a later turn
    assert gate.calls == 2
    await single.delete(*(rate_key("book", s, ns) for s in range(3)))
    await single.delete(cache.mark_key("slot:odd"), cache.mark_key("seen:7"))


async def test_versioned_reads_of_one_loop_turn_go_as_one_command_with_their_own_answers(
    single: Client, ns: str
) -> None:
    gate = CountingGate(single, backoff_s=1.0)
    cache = Cache(gate, namespace=ns)
    for i in range(0, 40, 2):  # the even keys hold a value, odd ones none
        assert await cache.set_bytes(f"v:{i}", b"[%d]" % i, 60)
    await cache.bump("v:3")  # a generation that is not the default
    gate.calls = 0

    results = await _released_together(40, lambda i: cache.get_versioned(f"v:{i}"))
    assert gate.calls == 1
    for i, (raw, life_s, generation) in enumerate(results):
        assert raw == (b"[%d]" % i if i % 2 == 0 else None)
        assert (59 < life_s <= 60) if i % 2 == 0 else life_s == 0.0
        assert generation == (b"1" if i == 3 else b"0")
    await single.delete(*(cache.value_key(f"v:{i}") for i in range(40)))
    await single.delete(cache.generation_key("v:3"))

    dead = RedisGate(make_client("redis://127.0.0.1:1/0", TIMEOUT_S), backoff_s=1.0)
    failed = await _released_together(
        3, lambda i: Cache(dead, namespace=ns).get_versioned(f"v:{i}")
    )
    assert failed == [(None, 0.0, None)] * 3  # nothing may be stored without Redis
    await dead.client.aclose()


async def test_stores_of_one_loop_turn_go_as_one_command_each_with_its_own_value(
    single: Client, ns: str
) -> None:
    gate = CountingGate(single, backoff_s=1.0)
    cache = Cache(gate, namespace=ns)
    await cache.bump(*(f"s:{i}" for i in range(0, 300, 3)))  # changed since their reads
    gate.calls = 0

    def store(i: int) -> Awaitable[bool]:
        return cache.set_if_unchanged(f"s:{i}", b"[%d]" % i, 30 + i % 7, b"0")

    # 300 stores: more than one command holds (200 calls), split in two.
    sizes = {"batch": "redis_list_stores"}
    sum_before = REGISTRY.get_sample_value("reservo_batch_items_sum", sizes) or 0.0
    stored = await _released_together(300, store)
    assert gate.calls == 2
    assert REGISTRY.get_sample_value("reservo_batch_items_sum", sizes) == sum_before + 300
    assert stored == [i % 3 != 0 for i in range(300)]
    for i in range(300):
        raw, life_s, _ = await cache.get_versioned(f"s:{i}")
        assert raw == (None if i % 3 == 0 else b"[%d]" % i)
        assert (29 + i % 7 < life_s <= 30 + i % 7) if i % 3 else life_s == 0.0
    await single.delete(*(cache.value_key(f"s:{i}") for i in range(300)))
    await single.delete(*(cache.generation_key(f"s:{i}") for i in range(0, 300, 3)))

    dead = RedisGate(make_client("redis://127.0.0.1:1/0", TIMEOUT_S), backoff_s=1.0)
    dead_cache = Cache(dead, namespace=ns)
    failed = await _released_together(
        3, lambda i: dead_cache.set_if_unchanged(f"s:{i}", b"[]", 30, b"0")
    )
    assert failed == [False] * 3
    await dead.client.aclose()


async def test_a_large_gate_batch_is_split_and_a_failure_answers_every_call(
    single: Client, ns: str
) -> None:
    gate = CountingGate(single, backoff_s=1.0)
    limiter = RateLimiter(gate, namespace=ns)
    batch = GateBatch(gate, limiter, 60_000, 1, max_calls=7)
    answers = await _released_together(20, lambda i: batch.check([rate_key("b", i, ns)]))
    assert gate.calls == 3  # 7 + 7 + 6
    assert all(a is not None and a[0] == 1 and 59_000 < a[1] <= 60_000 for a in answers)
    await single.delete(*(rate_key("b", i, ns) for i in range(20)))

    dead = RedisGate(make_client("redis://127.0.0.1:1/0", TIMEOUT_S), backoff_s=1.0)
    cache, dead_limiter = Cache(dead, namespace=ns), RateLimiter(dead, ns)
    failed = await _released_together(
        5, lambda i: cache.hit_and_check(dead_limiter, "book", i, 1, 60, "m")
    )
    assert failed == [(Decision(True, 1, 0), (False,))] * 5
    await dead.client.aclose()


async def test_scripts_reload_after_script_flush(private_redis: PrivateRedis, ns: str) -> None:
    """A restarted Redis has no scripts: both paths reload instead of failing open."""
    client = make_client(private_redis.url, TIMEOUT_S)
    try:
        gate = RedisGate(client, backoff_s=1.0)
        cache, limiter = Cache(gate, namespace=ns), RateLimiter(gate)
        await client.script_flush()
        d, (marked,) = await cache.hit_and_check(limiter, ns, 1, 5, 60, "m")
        assert d == Decision(True, 4, 0) and not marked
        await client.script_flush()
        assert await limiter.hit(ns, 1, 5, 60) == Decision(True, 3, 0)
        await client.script_flush()
        assert await cache.get_versioned("v") == (None, 0.0, b"0")
        assert gate.available
    finally:
        await client.aclose()


# --- failing open -------------------------------------------------------------------


def _failures() -> float:
    total = 0.0
    for reason in ("timeout", "connection", "error"):
        v = REGISTRY.get_sample_value("reservo_redis_failures_total", {"reason": reason})
        total += v or 0.0
    return total


class _CountingGate(RedisGate):
    """A gate that keeps the failures it saw: the failures metric is shared by
    every gate of the process, and a gate left behind by an earlier test (510
    failures were on it once in CI) can add to it while this one is watched."""

    def __init__(self, client: Client, backoff_s: float) -> None:
        super().__init__(client, backoff_s=backoff_s)
        self.seen: list[BaseException] = []

    def _on_failure(self, exc: BaseException) -> None:
        self.seen.append(exc)
        super()._on_failure(exc)


@contextlib.contextmanager
def _refusing_port() -> Iterator[int]:
    """A port bound and never listened on: every connection to it is refused,
    and no other process can start listening there while the test runs."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", free_port()))
        yield s.getsockname()[1]


@pytest.mark.parametrize("cluster", [False, True], ids=["single", "cluster"])
async def test_fail_open_when_nothing_listens(ns: str, cluster: bool) -> None:
    # A cluster client with no node to read the layout from raises
    # RedisClusterUnreachableError (not a RedisError): still a fail-open default.
    with _refusing_port() as port:
        client = make_client(f"redis://127.0.0.1:{port}/0", TIMEOUT_S, cluster=cluster)
        try:
            # A backoff far longer than the loop below takes on a loaded machine (it
            # took over 0.5 s once in CI and the gate tried again, as it should).
            gate = _CountingGate(client, backoff_s=30)
            cache, limiter = Cache(gate, namespace=ns), RateLimiter(gate)
            before = _failures()
            with capture_logs() as logs:
                assert (await limiter.hit(ns, 1, 1, 60)) == Decision(True, 1, 0)
                assert not gate.available
                # In backoff: defaults at once, no further attempt, no further warning.
                for _ in range(20):
                    (d, t) = await _timed(limiter.hit(ns, 1, 1, 60))
                    assert d.allowed and t < 0.05
                    (v, t) = await _timed(cache.get_json("k"))
                    assert v is None and t < 0.05
                    assert not await cache.set_json("k", 1, 10)
                    assert not await cache.is_marked("k")
                    assert not await cache.mark("k", 10)
                    assert await cache.delete("k") == 0
                    hc, _ = await _timed(cache.hit_and_check(limiter, ns, 1, 1, 60, "k"))
                    assert hc == (Decision(True, 1, 0), (False,))
                assert not await gate.ping()
            assert len(gate.seen) == 1, [f"{type(e).__name__}: {e}" for e in gate.seen]
            # Counted in the metric (which other gates of the process share).
            assert _failures() >= before + 1
            assert [e["event"] for e in logs if e["log_level"] == "warning"] == [
                "redis.unavailable"
            ]
        finally:
            await client.aclose()


async def test_fail_open_kill_and_recover(private_redis: PrivateRedis, ns: str) -> None:
    client = make_client(private_redis.url, TIMEOUT_S)
    backoff_s = 0.4
    try:
        gate = RedisGate(client, backoff_s=backoff_s)
        cache, limiter = Cache(gate, namespace=ns), RateLimiter(gate)
        assert await gate.ping()
        assert await cache.set_json("k", {"v": 1}, 60)
        assert (await limiter.hit(ns, 1, 1, 60)).allowed
        assert not (await limiter.hit(ns, 1, 1, 60)).allowed

        private_redis.stop()
        d, t = await _timed(limiter.hit(ns, 1, 1, 60))
        assert d.allowed and t < 1.0  # one failed attempt, bounded by the timeout
        assert not gate.available
        v, t = await _timed(cache.get_json("k"))
        assert v is None and t < 0.05  # skipped: in backoff

        private_redis.start()  # same port, empty data, no scripts
        assert not gate.available  # still backing off; Redis untouched
        assert not await cache.is_marked("x")
        await asyncio.sleep(backoff_s + 0.05)
        assert gate.available
        with capture_logs() as logs:
            assert await gate.ping()
        assert [e["event"] for e in logs] == ["redis.recovered"]
        assert await cache.set_json("k", {"v": 2}, 60)
        assert await cache.get_json("k") == {"v": 2}
        assert await limiter.hit(ns, 1, 1, 60) == Decision(True, 0, 0)
        assert not (await limiter.hit(ns, 1, 1, 60)).allowed
    finally:
        await client.aclose()


async def test_fail_open_when_redis_hangs(private_redis: PrivateRedis, ns: str) -> None:
    """A frozen Redis (accepts, never answers) costs one timeout, then nothing."""
    client = make_client(private_redis.url, TIMEOUT_S)
    backoff_s = 0.5
    try:
        gate = RedisGate(client, backoff_s=backoff_s)
        cache, limiter = Cache(gate, namespace=ns), RateLimiter(gate)
        assert await gate.ping()
        private_redis.pause()
        d, t = await _timed(limiter.hit(ns, 1, 5, 60))
        assert d.allowed and TIMEOUT_S * 0.8 <= t < TIMEOUT_S * 4
        _, t = await _timed(cache.get_json("k"))
        assert t < 0.05
        private_redis.resume()
        await asyncio.sleep(backoff_s + 0.05)
        assert await gate.ping()
        assert await cache.set_json("k", 1, 10)
        assert await cache.get_json("k") == 1
    finally:
        await client.aclose()


async def test_gate_timeout_bounds_whole_call(client: Client) -> None:
    """``timeout_s`` caps a call even when each socket read is within its own timeout."""
    gate = RedisGate(client, backoff_s=0.2, timeout_s=0.1)

    async def slow(c: Client) -> str:
        await c.ping()
        await asyncio.sleep(0.5)
        return "late"

    result, t = await _timed(gate.call(slow, "default"))
    assert result == "default" and t < 0.3
    assert not gate.available
