"""The jobs page's category actions in a real headless Chromium: an operator
pauses a category (its due jobs wait, the real scheduler runs none), sets and
removes its rate limit, retries its DEAD jobs in bulk, and resumes it, after
which the jobs that waited run."""

from __future__ import annotations

from collections.abc import AsyncIterator
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from reservo.settings import Settings
from tests.helpers.auth import auth
from tests.helpers.browser import Live, serve, sign_in
from tests.helpers.scheduler import FAST_SETTINGS, Recorder, category, running
from tests.helpers.waiting import wait_until

SERVICE = auth("service", 1)


@pytest.fixture
async def live(base_settings: Settings) -> AsyncIterator[Live]:
    async for running_app in serve(base_settings.with_(**FAST_SETTINGS)):
        yield running_app


async def _create(live: Live, cat: str, run_at: datetime) -> int:
    body = {"category": cat, "runAt": run_at.isoformat(), "payload": {}}
    r = await live.http.post("/api/jobs", json=body, headers=SERVICE)
    assert r.status_code == 201, r.text
    return int(r.json()["jobId"])


async def _category(live: Live, cat: str) -> dict[str, Any]:
    r = await live.http.get("/api/job-categories", headers=SERVICE)
    return next(c for c in r.json() if c["category"] == cat)


async def test_an_operator_pauses_throttles_retries_and_resumes_a_category(
    page: Any, live: Live
) -> None:
    cat, rec = category(), Recorder()
    scheduler = live.container.scheduler
    scheduler.register(cat, rec)
    await sign_in(page, live)
    await page.goto(f"{live.url}/console/jobs")
    row = page.locator(f"#categories tr[data-category='{cat}']")
    assert "running" in await row.locator(".state").inner_text()

    await row.get_by_role("button", name=f"Pause {cat}").click()
    await page.wait_for_load_state()
    row = page.locator(f"#categories tr[data-category='{cat}']")
    assert await row.locator(".state").inner_text() == "PAUSED"
    assert (await _category(live, cat))["paused"] is True

    waiting = [await _create(live, cat, datetime.now(UTC)) for _ in range(3)]
    dead = await _create(live, cat, datetime.now(UTC) + timedelta(hours=1))
    async with live.container.db.connection() as conn:
        await conn.execute("UPDATE scheduled_job SET status = 'DEAD' WHERE id = $1", dead)
    async with running(scheduler):
        await page.wait_for_timeout(1500)
        assert rec.calls == {}  # paused: nothing runs
        await page.reload()
        row = page.locator(f"#categories tr[data-category='{cat}']")
        assert await row.locator(".due").inner_text() == "3"
        assert await row.locator(".dead").inner_text() == "1"

        await row.locator("input[name='per_second']").fill("25")
        await row.get_by_role("button", name=f"Set the rate limit of {cat}").click()
        await page.wait_for_load_state()
        assert (await _category(live, cat))["perSecond"] == 25
        row = page.locator(f"#categories tr[data-category='{cat}']")
        assert await row.locator("input[name='per_second']").input_value() == "25"

        await row.get_by_role("button", name=f"DEAD jobs of {cat}").click()
        await page.wait_for_load_state()
        assert await page.locator("#retried").inner_text() == "Retried 1 DEAD job."
        row = page.locator(f"#categories tr[data-category='{cat}']")
        assert await row.locator(".dead").inner_text() == "0"

        await row.locator("input[name='per_second']").fill("")
        await row.get_by_role("button", name=f"Set the rate limit of {cat}").click()
        await page.wait_for_load_state()
        assert (await _category(live, cat))["perSecond"] is None

        row = page.locator(f"#categories tr[data-category='{cat}']")
        await row.get_by_role("button", name=f"Resume {cat}").click()
        await page.wait_for_load_state()
        row = page.locator(f"#categories tr[data-category='{cat}']")
        assert await row.locator(".state").inner_text() == "running"

        async def all_ran() -> bool:
            return set(rec.calls) == {*waiting, dead}

        await wait_until(all_ran, 15)
    assert all(n == 1 for n in rec.calls.values())
