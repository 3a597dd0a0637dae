"""Console page times against a large database, and the pulse's cost.

    .venv/bin/python bench/console/run.py [--db reservo_bench] [--requests 30]

Serves the app in-process (httpx's ASGI transport: no network, no other load),
signs in as admin and times each console page (queries and rendering), then
times one pulse sample: what every process pays once a second to publish its
counters. Point ``--db`` at a database loaded by another benchmark (the
appointments one by default: 1,120,000 slots); it is only read."""

from __future__ import annotations

import argparse
import asyncio
import re
import statistics
import sys
import time
from datetime import timedelta
from pathlib import Path

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchlib import JWT_SECRET, NAMESPACE, REDIS_URL, SECRET_SETTINGS, db_url
from reservo.app import create_app
from reservo.bootstrap import build
from reservo.console.setup import Console
from reservo.core.http.auth import mint_token
from reservo.core.kernel import metrics
from reservo.core.kernel.clock import SystemClock
from reservo.settings import Settings

PAGES = (
    "/console",
    "/console/overview/panels",
    "/console/jobs",
    "/console/jobs/counts",
    "/console/jobs?status=DEAD",
    "/console/jobs?category=bench.c7",
    "/console/jobs?status=FAILED&category=bench.c3",
    "/console/dead-letters",
    "/console/dead-letters?consumer=bench-consumer-1",
)


async def _details(client: httpx.AsyncClient, token: str) -> list[str]:
    """The newest job's and dead letter's own pages, when there are any."""
    bearer = {"Authorization": f"Bearer {token}"}
    found = []
    for api, field, page in (
        ("/api/jobs", "jobId", "/console/jobs"),
        ("/api/ops/dead-letters", "id", "/console/dead-letters"),
    ):
        items = (await client.get(api, params={"limit": 1}, headers=bearer)).json()["items"]
        found += [f"{page}/{i[field]}" for i in items]
    return found


async def main(db: str, requests: int, samples: int) -> None:
    settings = Settings(
        database_url=db_url(db),
        redis_url=REDIS_URL,
        redis_namespace=f"{NAMESPACE}:console",
        **SECRET_SETTINGS,
        log_json=False,
    )
    container = build(settings)
    app = create_app(container, owns_container=False)
    token = mint_token(JWT_SECRET, "admin", 1, timedelta(hours=1), SystemClock().now())
    transport = httpx.ASGITransport(app=app)
    async with httpx.AsyncClient(transport=transport, base_url="http://bench.test") as client:
        form = await client.get("/console/sign-in")
        nonce = re.search(r'name="nonce" value="([^"]+)"', form.text)
        assert nonce is not None
        signed = await client.post("/console/sign-in", data={"token": token, "nonce": nonce[1]})
        assert signed.status_code == 303, signed.text
        for path in [*PAGES, *await _details(client, token)]:
            times = []
            for _ in range(requests):
                t = time.perf_counter()
                r = await client.get(path)
                times.append((time.perf_counter() - t) * 1000)
                assert r.status_code == 200, r.text
            times.sort()
            print(
                f"{path}: p50 {statistics.median(times):.1f} ms  "
                f"p95 {times[int(len(times) * 0.95) - 1]:.1f} ms  max {times[-1]:.1f} ms"
            )
    pulse = container.module(Console).pulse
    cpu = time.process_time()
    for _ in range(samples):
        metrics.BOOKINGS.labels("appointments").inc()
        await pulse.sample()
    per = (time.process_time() - cpu) / samples * 1e6
    print(
        f"pulse sample (counters read + one pipelined HINCRBY): {per:.0f} us CPU, "
        "paid once per second per process"
    )
    await container.close()


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--db", default="reservo_bench")
    parser.add_argument("--requests", type=int, default=30)
    parser.add_argument("--samples", type=int, default=1000)
    args = parser.parse_args()
    asyncio.run(main(args.db, args.requests, args.samples))
