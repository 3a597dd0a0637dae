"""The last scheduled run's tally, kept in Redis for the console (the
maintenance worker runs the checks; the console is served by the API
processes). Redis is a cache here too: lost, the console says "not run
yet" until the next run; the gauge reservo_invariant_violations is the
figure to alert on."""

from __future__ import annotations

import json
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from reservo.core.redis.client import RedisGate
from reservo.verify.domain import Report

# Kept a day: a worker that stopped running the checks leaves no stale "all
# clear" behind for longer than that.
TTL_S = 86_400


@dataclass(frozen=True)
class Status:
    at: datetime
    duration_s: float
    violations: dict[str, int]  # check -> violations (every check of the run)

    @property
    def ok(self) -> bool:
        return not any(self.violations.values())


def key(namespace: str) -> str:
    return f"{namespace}:verify:last"


async def save(gate: RedisGate, namespace: str, report: Report) -> None:
    value = json.dumps(
        {
            "at": report.started_at.isoformat() if report.started_at else None,
            "durationS": report.duration_s,
            "violations": report.violations(),
        }
    )

    async def write(client: Any) -> None:
        await client.set(key(namespace), value, ex=TTL_S)

    await gate.call(write, None)


async def load(gate: RedisGate, namespace: str) -> Status | None:
    """The last run's tally, or None (never run, expired, or Redis away)."""

    async def read(client: Any) -> Any:
        return await client.get(key(namespace))

    raw = await gate.call(read, None)
    if raw is None:
        return None
    data = json.loads(raw)
    return Status(
        datetime.fromisoformat(data["at"]), float(data["durationS"]), dict(data["violations"])
    )
