"""The README's picture of the overview, taken from the demo data (the same
seeding as `reservo up --demo`) with a little traffic through the API.

Written to docs/console-overview.png when RESERVO_UPDATE_SCREENSHOTS=1 (so a
plain test run leaves the work tree clean); otherwise to the test's tmp dir."""

from __future__ import annotations

import asyncio
import os
import uuid
from collections.abc import AsyncIterator
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest

from reservo import demo
from reservo.bootstrap import ALL, run_workers
from reservo.settings import Settings
from tests.helpers.auth import auth, new_id
from tests.helpers.browser import Live, serve, sign_in

DOCS = Path(__file__).resolve().parents[2] / "docs"


@pytest.fixture
async def demo_live(base_settings: Settings, own_database: str) -> AsyncIterator[Live]:
    settings = demo.settings_for_demo(
        base_settings.with_(
            database_url=own_database, redis_namespace=f"shot-{uuid.uuid4().hex[:8]}"
        )
    )
    async for running in serve(settings):
        running.doctors = await demo.load(running.container)
        # Every worker role, as `reservo up --demo` runs them (the relay drains the outbox).
        stop = asyncio.Event()
        workers = asyncio.create_task(run_workers(running.container, [ALL], stop))
        yield running
        stop.set()
        await workers


async def _traffic(live: Live, seconds: int) -> None:
    """A few booking attempts per second on the demo's slots, some refused."""
    tomorrow = (live.container.clock.now().date() + timedelta(days=1)).isoformat()
    slots: list[int] = []
    for doctor in live.doctors:
        r = await live.http.get(
            f"/api/doctors/{doctor}/slots", params={"date": tomorrow}, headers=auth("admin", 1)
        )
        assert r.status_code == 200, r.text
        slots += [s["id"] for s in r.json() if s["available"] > 0]
    assert slots, "the demo has slots"
    fresh = iter(slots[4:])
    for second in range(seconds):
        burst = 1 + (second * 7) % 6
        for i in range(burst):
            # Every other attempt goes to one of four hot slots (full after their
            # first booking: refused), the others each to a free slot (booked).
            slot = slots[i % 4] if i % 2 == 0 else next(fresh)
            patient = new_id()
            await live.http.post(
                "/api/appointments",
                json={"slotId": slot, "patientId": patient},
                headers={**auth("patient", patient), "Idempotency-Key": str(uuid.uuid4())},
            )
        await asyncio.sleep(1)


async def test_screenshot_of_the_overview_with_the_demo_data(
    page: Any, demo_live: Live, tmp_path: Path
) -> None:
    await _traffic(demo_live, 20)
    await page.set_viewport_size({"width": 1280, "height": 1000})
    await sign_in(page, demo_live)
    await page.locator("#chart-booked").wait_for()
    await asyncio.sleep(1.5)  # the last second's counts reach Redis
    await page.reload()
    assert int(await page.locator("#chart-booked .total").inner_text()) > 0
    assert int(await page.locator("#chart-refused .total").inner_text()) > 0
    update = os.environ.get("RESERVO_UPDATE_SCREENSHOTS") == "1"
    target = DOCS / "console-overview.png" if update else tmp_path / "console-overview.png"
    await page.screenshot(path=str(target), full_page=True)
    assert target.stat().st_size > 10_000
