"""Per-second figures of the last minutes, shared by every process through Redis.

The use cases already count what they do in Prometheus counters (bookings,
refusals, bets...), a dict increment each, on the hot path. A ``Pulse`` reads
those counters of its own process once a second and adds what changed since its
last reading to Redis, in one pipelined round trip per process and second
(``HINCRBY`` on a hash per minute, field ``<figure>:<second>``, with a TTL). The
console then reads the last minutes of every process from a handful of hashes.

So the storm's hot path pays nothing more than the counter it already paid, and
API processes on several machines add up in the same buckets. Telemetry is best
effort (principle 2): when Redis is away the deltas wait in the process and are
written once it is back; losing Redis loses only the chart's past.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass

import structlog
from prometheus_client import Counter
from prometheus_client.samples import Sample

from reservo.core.aio.loops import run_every
from reservo.core.kernel import metrics
from reservo.core.kernel.clock import Clock
from reservo.core.redis.client import Client, RedisGate

log = structlog.get_logger(__name__)

# Buckets live this long: the console shows at most the last few minutes.
KEEP_S = 15 * 60


@dataclass(frozen=True)
class Figure:
    """One per-second series: the sum of a counter's samples whose labels pass ``keep``."""

    name: str
    title: str
    counter: Counter
    keep: Callable[[Mapping[str, str]], bool] = lambda _labels: True


def of_module(module: str) -> Callable[[Mapping[str, str]], bool]:
    """``keep`` for a counter shared by modules: only ``module``'s samples."""
    return lambda labels: labels.get("module") == module


FIGURES: tuple[Figure, ...] = (
    Figure("booked", "Appointments booked", metrics.BOOKINGS, of_module("appointments")),
    Figure("refused", "Booking attempts refused (full, rate limited, taken)", metrics.CONFLICTS),
    Figure("holds", "Car holds placed", metrics.BOOKINGS, of_module("rentals")),
    Figure("bets", "Bets placed", metrics.BETS_PLACED),
    Figure("results", "Match results received", metrics.RESULTS_RECEIVED),
    Figure("settled", "Bets settled", metrics.BETS_SETTLED),
    Figure("parked", "Events parked as dead letters", metrics.PARKED),
)

# One sampler per process: the counters are the process's, so a second sampler
# (``reservo up`` hosts the API and the workers in one process; tests build many
# graphs) would add the same deltas twice.
_sampler_running = False


def _total(figure: Figure) -> float:
    samples: Iterable[Sample] = (s for m in figure.counter.collect() for s in m.samples)
    return sum(s.value for s in samples if s.name.endswith("_total") and figure.keep(s.labels))


class Pulse:
    def __init__(
        self,
        gate: RedisGate,
        namespace: str,
        clock: Clock,
        figures: tuple[Figure, ...] = FIGURES,
    ) -> None:
        self.gate = gate
        self.namespace = namespace
        self.clock = clock
        self.figures = figures
        self._written = {f.name: _total(f) for f in figures}

    def _key(self, minute: int) -> str:
        return f"{self.namespace}:pulse:{minute}"

    async def sample(self) -> bool:
        """Add what the counters gained since the last sample to the current second.
        False when Redis did not take it (the deltas are kept for the next try)."""
        totals = {f.name: _total(f) for f in self.figures}
        deltas = {n: int(v - self._written[n]) for n, v in totals.items() if v > self._written[n]}
        if not deltas:
            return True
        second = int(self.clock.now().timestamp())
        key = self._key(second // 60)

        async def write(client: Client) -> bool:
            pipe = client.pipeline(transaction=False)
            for name, delta in deltas.items():
                pipe.hincrby(key, f"{name}:{second % 60}", delta)
            pipe.expire(key, KEEP_S)
            await pipe.execute()
            return True

        if not await self.gate.call(write, False):
            return False
        for name in deltas:
            self._written[name] += deltas[name]
        return True

    async def run(self, stop: asyncio.Event) -> None:
        """Sample once a second until ``stop``; a no-op when this process already
        has a sampler."""
        global _sampler_running
        if _sampler_running:
            await stop.wait()
            return
        _sampler_running = True
        self._written = {f.name: _total(f) for f in self.figures}
        try:
            await run_every(stop, 1.0, "pulse", self.sample)
        finally:
            with contextlib.suppress(Exception):
                await self.sample()  # what the last second counted
            _sampler_running = False

    async def series(self, seconds: int) -> dict[str, list[int]]:
        """Each figure's per-second counts over the last ``seconds`` full seconds,
        oldest first (the running second is left out: it is still being counted)."""
        end = int(self.clock.now().timestamp())  # exclusive
        start = end - seconds
        minutes = range(start // 60, (end - 1) // 60 + 1)

        async def read(client: Client) -> list[dict[bytes, bytes]]:
            pipe = client.pipeline(transaction=False)
            for minute in minutes:
                pipe.hgetall(self._key(minute))
            return list(await pipe.execute())

        nothing: list[dict[bytes, bytes]] = []
        hashes = await self.gate.call(read, nothing)
        out = {f.name: [0] * seconds for f in self.figures}
        for minute, fields in zip(minutes, hashes, strict=False):
            for field, value in fields.items():
                name, _, sec = field.decode().partition(":")
                at = minute * 60 + int(sec) - start
                if name in out and 0 <= at < seconds:
                    out[name][at] += int(value)
        return out
