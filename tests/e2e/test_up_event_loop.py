"""`reservo up` serves on uvloop, as `reservo api` does.

`reservo up` runs its server inside a loop of its own (the API shares it with every
background role), so uvicorn's ``loop="uvloop"`` setting never applies there: the
loop is the one `up` itself starts. On the standard asyncio loop the one process
spent much of a booking storm in its socket writes (bench/booking_storm/run.py
--server up; docs/BENCHMARKS.md, "`reservo up` per core")."""

from __future__ import annotations

import json
from pathlib import Path

from reservo.settings import Settings
from tests.helpers.procs import env_for, free_port, running, wait_http


async def test_reservo_up_serves_on_uvloop(
    base_settings: Settings, own_database: str, tmp_path: Path
) -> None:
    settings = base_settings.with_(database_url=own_database)
    port = free_port()
    log = tmp_path / "up.log"
    env = env_for(settings, RESERVO_LOG_LEVEL="INFO", RESERVO_LOG_JSON="true")
    with running(["up", "--port", str(port)], env, log) as proc:
        wait_http(f"http://127.0.0.1:{port}/healthz", proc, log)
        lines = [json.loads(ln) for ln in log.read_text().splitlines() if ln.startswith("{")]
    up = [ln for ln in lines if ln.get("event") == "reservo_up"]
    assert len(up) == 1, log.read_text()
    assert up[0]["loop"] == "uvloop", up[0]
