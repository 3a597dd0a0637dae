"""`reservo up --demo` lets `http` jobs call the service itself, on its own port
only: the embedded PostgreSQL and Redis listen on other ports of the same
loopback address, and a job aimed at them is refused in whatever spelling the
address is written (422 at POST for a literal; a name is refused when the job
runs). `reservo config --demo` and the start-up banner show the allowance."""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import time
from pathlib import Path
from typing import Any

import asyncpg
import httpx
import pytest

from reservo.scheduler.handlers import POLICY_ERROR
from tests.helpers.auth import JWT_SECRET, PAY_SECRET, RESULTS_SECRET, SERVICE
from tests.helpers.procs import BIN, free_port, running, wait_http

pytestmark = [pytest.mark.slow, pytest.mark.timeout(240)]

# 127.0.0.1 as a caller may spell it in a URL.
SPELLINGS = [
    "127.0.0.1",
    "2130706433",  # decimal
    "0x7f000001",  # hex
    "0x7f.0.0.1",
    "0177.0.0.1",  # octal
    "127.1",
    "[::ffff:127.0.0.1]",  # IPv4-mapped IPv6
    "[::ffff:7f00:1]",
]


def _env(tmp: Path) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("RESERVO_")}
    env.update(
        RESERVO_DATA_DIR=str(tmp),
        RESERVO_LOG_LEVEL="INFO",
        RESERVO_LOG_JSON="true",
        RESERVO_HTTP_DRAIN_S="0",
        RESERVO_JWT_SECRET=JWT_SECRET,
        RESERVO_PAYMENTS_WEBHOOK_SECRET=PAY_SECRET,
        RESERVO_RESULTS_WEBHOOK_SECRET=RESULTS_SECRET,
    )
    return env


def _job(client: httpx.Client, url: str) -> httpx.Response:
    body = {"category": "http", "payload": {"url": url, "method": "GET"}}
    return client.post("/api/jobs", json=body, headers=SERVICE)


def _settled(client: httpx.Client, job_id: int, timeout_s: float = 60) -> dict[str, Any]:
    deadline = time.monotonic() + timeout_s
    while True:
        got: dict[str, Any] = client.get(f"/api/jobs/{job_id}", headers=SERVICE).json()
        if got["status"] in ("DONE", "DEAD") or time.monotonic() > deadline:
            return got
        time.sleep(0.2)


async def _stored_urls(database_url: str) -> set[str]:
    conn = await asyncpg.connect(database_url)
    try:
        rows = await conn.fetch("SELECT payload->>'url' AS url FROM scheduled_job")
    finally:
        await conn.close()
    return {r["url"] for r in rows}


def test_config_shows_the_demo_allowance(tmp_path: Path) -> None:
    done = subprocess.run(
        [str(BIN), "config", "--demo", "--port", "8123"],
        env=_env(tmp_path),
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    lines = dict(line.split("=", 1) for line in done.stdout.splitlines())
    assert lines["RESERVO_JOBS_HTTP_ALLOW"] == "127.0.0.1:8123  # reservo up --demo"
    plain = subprocess.run(
        [str(BIN), "config"], env=_env(tmp_path), capture_output=True, text=True, check=True
    )
    lines = dict(line.split("=", 1) for line in plain.stdout.splitlines())
    assert lines["RESERVO_JOBS_HTTP_ALLOW"].startswith("  # default (none:")


def test_demo_jobs_reach_the_service_port_only(tmp_path: Path) -> None:
    port = free_port()
    log = tmp_path / "up.log"
    with running(["up", "--demo", "--port", str(port)], _env(tmp_path), log) as proc:
        wait_http(f"http://127.0.0.1:{port}/readyz", proc, log, timeout_s=120)
        lines = [json.loads(line) for line in log.read_text().splitlines() if line.startswith("{")]
        events = {line["event"]: line for line in lines}
        # The start-up log says what `http` jobs may reach.
        assert events["reservo_up"]["jobs_http_allow"] == f"127.0.0.1:{port}", events
        stores = {
            "postgres": httpx.URL(events["reservo_up"]["postgres"]).port,
            "redis": httpx.URL(events["reservo_up"]["redis"]).port,
        }
        assert None not in stores.values() and port not in stores.values(), stores
        with httpx.Client(base_url=f"http://127.0.0.1:{port}", timeout=10) as client:
            refused = []
            for store, store_port in stores.items():
                for host in SPELLINGS:
                    refused.append(url := f"http://{host}:{store_port}/")
                    r = _job(client, url)
                    assert r.status_code == 422, (store, host, r.text)
                    assert r.headers["content-type"].startswith("application/problem+json")
                    assert r.json()["code"] == "destination_not_allowed", (store, host, r.json())
            # Nothing was stored for the refused ones (the demo's own recurring
            # job to /healthz may have been, meanwhile: it is not compared).
            stored = asyncio.run(_stored_urls(events["reservo_up"]["postgres"]))
            assert not set(refused) & stored, stored

            # A name is resolved when the job runs: refused then, parked at once.
            r = _job(client, f"http://localhost:{stores['postgres']}/")
            assert r.status_code == 201, r.text
            parked = _settled(client, r.json()["jobId"])
            assert parked["status"] == "DEAD" and parked["attempts"] == 1, parked
            assert parked["lastError"] == POLICY_ERROR

            # The service's own port, in another spelling, is allowed and called.
            r = _job(client, f"http://2130706433:{port}/healthz")
            assert r.status_code == 201, r.text
            called = _settled(client, r.json()["jobId"])
            assert called["status"] == "DONE" and called["lastError"] is None, called
        assert proc.poll() is None
