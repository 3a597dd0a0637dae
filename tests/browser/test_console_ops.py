"""The console's jobs and dead-letters pages in a real headless Chromium: a job
made DEAD by the real scheduler retried from its page and then run, a scheduled
job cancelled, a dead letter (parked by a handler's rejection) replayed and
applied exactly once, and forged posts on these actions refused without effect."""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator
from datetime import UTC, datetime, timedelta
from typing import Any

import asyncpg
import pytest

from reservo.core.messaging.failures import Rejected
from reservo.core.messaging.inbox import once
from reservo.core.messaging.outbox import emit
from reservo.core.messaging.transport.base import Event
from reservo.core_modules import Outbox
from reservo.scheduler.domain import Job, JobFailure
from reservo.settings import Settings
from tests.helpers.auth import auth
from tests.helpers.browser import Live, serve, sign_in
from tests.helpers.scheduler import FAST_SETTINGS, category, running
from tests.helpers.waiting import wait_until

SERVICE = auth("service", 1)
ADMIN = auth("admin", 1)
TOPIC = "test.console-replay.v1"


@pytest.fixture
async def live(base_settings: Settings) -> AsyncIterator[Live]:
    # Scheduler timings fast enough for a job to die and run again within seconds.
    async for running_app in serve(base_settings.with_(**FAST_SETTINGS)):
        yield running_app


class Switch:
    """A job handler that refuses for good (the job goes DEAD at once) until
    told to succeed; counts the runs it let succeed."""

    def __init__(self) -> None:
        self.fail = True
        self.succeeded: list[int] = []

    async def __call__(self, job: Job) -> None:
        if self.fail:
            raise JobFailure("refused for the test", "refused for the test", permanent=True)
        self.succeeded.append(job.id)


class Flaky:
    """A consumer that rejects events until told otherwise, then applies each
    once (through the inbox, as every consumer does) and counts what it applied."""

    def __init__(self, live: Live, consumer: str) -> None:
        self.live, self.consumer, self.reject = live, consumer, True
        self.applied: list[uuid.UUID] = []

    async def __call__(self, event: Event) -> None:
        if self.reject:
            raise Rejected(f"cannot handle {event.payload['n']}")

        async def apply(conn: asyncpg.Connection) -> None:
            self.applied.append(event.id)

        await once(self.live.container.db, self.consumer, event, apply)


async def _create_job(live: Live, cat: str, run_at: datetime) -> int:
    body = {"category": cat, "runAt": run_at.isoformat(), "payload": {"n": 1}}
    r = await live.http.post("/api/jobs", json=body, headers=SERVICE)
    assert r.status_code == 201, r.text
    return int(r.json()["jobId"])


async def _job_status(live: Live, job_id: int) -> str:
    r = await live.http.get(f"/api/jobs/{job_id}", headers=SERVICE)
    assert r.status_code == 200, r.text
    status: str = r.json()["status"]
    return status


async def _park_one(live: Live, flaky: Flaky) -> tuple[uuid.UUID, int]:
    """An event the consumer rejects, parked by the relay; its dead letter's id."""
    c = live.container
    c.subscriptions.add(flaky.consumer, [TOPIC], flaky)
    async with c.db.transaction() as conn:
        event_id = await emit(conn, TOPIC, "k", {"n": 1}, c.clock.now())
    while await c.module(Outbox).relay.run_once():
        pass
    r = await live.http.get(
        "/api/ops/dead-letters", params={"consumer": flaky.consumer}, headers=ADMIN
    )
    items = r.json()["items"]
    assert [i["eventId"] for i in items] == [str(event_id)], r.text
    return event_id, int(items[0]["id"])


async def test_a_dead_job_is_retried_from_its_page_and_then_runs(page: Any, live: Live) -> None:
    cat, handler = category(), Switch()
    scheduler = live.container.scheduler
    scheduler.register(cat, handler)
    job_id = await _create_job(live, cat, datetime.now(UTC))
    async with running(scheduler):
        await wait_until(lambda: _is(live, job_id, "DEAD"), 20)

    await sign_in(page, live)
    await page.goto(f"{live.url}/console/jobs?status=DEAD&category={cat}")
    row = page.locator(f"#jobs tr[data-job='{job_id}']")
    assert "DEAD" in await row.inner_text()
    dead_count = await page.locator("#count-DEAD").inner_text()
    assert int(dead_count.rstrip("+").replace(",", "")) >= 1
    await row.locator("a").click()
    await page.wait_for_url(f"{live.url}/console/jobs/{job_id}")
    assert await page.locator("#job-status").inner_text() == "DEAD"
    assert "refused for the test" in await page.locator("#executions").inner_text()

    handler.fail = False
    await page.click("button:text('Retry now')")
    await page.wait_for_load_state()
    assert page.url == f"{live.url}/console/jobs/{job_id}"
    # Scheduled again (and handed to Redis at once: QUEUED); no worker runs yet.
    assert await page.locator("#job-status").inner_text() in ("SCHEDULED", "QUEUED")
    assert await page.locator("button:text('Retry now')").count() == 0
    assert handler.succeeded == []

    async with running(scheduler):
        await wait_until(lambda: _is(live, job_id, "DONE"), 20)
    await page.reload()
    assert await page.locator("#job-status").inner_text() == "DONE"
    runs = await page.locator("#executions tbody tr").all_inner_texts()
    assert len(runs) == 2 and "DEAD" in runs[0] and "DONE" in runs[1]
    assert handler.succeeded == [job_id]


async def _is(live: Live, job_id: int, status: str) -> bool:
    return await _job_status(live, job_id) == status


async def test_a_scheduled_job_is_cancelled_from_its_page(page: Any, live: Live) -> None:
    cat = category()
    live.container.scheduler.register(cat, Switch())
    job_id = await _create_job(live, cat, datetime.now(UTC) + timedelta(hours=1))

    await sign_in(page, live)
    await page.goto(f"{live.url}/console/jobs?category={cat}")
    assert "SCHEDULED" in await page.locator(f"#jobs tr[data-job='{job_id}']").inner_text()
    await page.goto(f"{live.url}/console/jobs/{job_id}")
    await page.click("button:text('Cancel')")
    await page.wait_for_load_state()
    assert await page.locator("#job-status").inner_text() == "CANCELLED"
    assert await page.locator("button:text('Cancel')").count() == 0
    assert await _job_status(live, job_id) == "CANCELLED"

    # Cancelling a job that already ran is refused on the page, in words.
    done = await _create_job(live, cat, datetime.now(UTC) + timedelta(hours=1))
    await page.goto(f"{live.url}/console/jobs/{done}")
    async with live.container.db.connection() as conn:
        await conn.execute("UPDATE scheduled_job SET status = 'DONE' WHERE id = $1", done)
    await page.click("button:text('Cancel')")
    await page.wait_for_load_state()
    alert = await page.locator("[role=alert]").inner_text()
    assert "DONE" in alert and "can no longer be cancelled" in alert
    assert await _job_status(live, done) == "DONE"


async def test_a_recurring_job_is_deleted_from_the_jobs_page(page: Any, live: Live) -> None:
    cat = category()
    live.container.scheduler.register(cat, Switch())
    body = {"category": cat, "cron": "*/5 * * * *", "timezone": "UTC", "payload": {}}
    r = await live.http.post("/api/recurring-jobs", json=body, headers=SERVICE)
    assert r.status_code == 201, r.text
    recurring = r.json()["id"]

    await sign_in(page, live)
    await page.goto(f"{live.url}/console/jobs")
    row = page.locator("#recurring tr", has_text=cat)
    assert "*/5 * * * *" in await row.inner_text()
    await row.locator("button").click()
    await page.wait_for_url(f"{live.url}/console/jobs")
    assert await page.locator("#recurring tr", has_text=cat).count() == 0
    # Gone for the API too: deleting it again is 404.
    r = await live.http.delete(f"/api/recurring-jobs/{recurring}", headers=SERVICE)
    assert r.status_code == 404, r.text


async def test_the_pages_fit_a_phone(page: Any, live: Live) -> None:
    cat = category()
    live.container.scheduler.register(cat, Switch())
    job_id = await _create_job(live, cat, datetime.now(UTC) + timedelta(hours=1))
    flaky = Flaky(live, f"test-console-{uuid.uuid4().hex[:8]}")
    _, letter = await _park_one(live, flaky)
    await sign_in(page, live)
    await page.set_viewport_size({"width": 390, "height": 844})
    for path in (
        "/console/jobs",
        f"/console/jobs/{job_id}",
        "/console/dead-letters",
        f"/console/dead-letters/{letter}",
    ):
        await page.goto(f"{live.url}{path}")
        # Wide tables scroll inside their card; the page itself never sideways.
        assert await page.evaluate("document.documentElement.scrollWidth") <= 390, path


async def test_a_dead_letter_is_inspected_and_replayed_once(page: Any, live: Live) -> None:
    flaky = Flaky(live, f"test-console-{uuid.uuid4().hex[:8]}")
    event_id, letter = await _park_one(live, flaky)

    await sign_in(page, live)
    await page.goto(f"{live.url}/console/dead-letters?consumer={flaky.consumer}")
    row = page.locator(f"#letters tr[data-letter='{letter}']")
    assert "PARKED" in await row.inner_text() and "cannot handle 1" in await row.inner_text()
    await row.locator("a").click()
    await page.wait_for_url(f"{live.url}/console/dead-letters/{letter}")
    assert "cannot handle 1" in await page.locator("#letter-error").inner_text()
    event = await page.locator("#letter-event").inner_text()
    assert str(event_id) in event and TOPIC in event

    # Still refused: the page says so, the letter stays parked.
    await page.click("button:text('Replay')")
    await page.wait_for_load_state()
    assert "refused the event again" in await page.locator("[role=alert]").inner_text()
    assert await page.locator("#letter-state").inner_text() == "PARKED"
    assert flaky.applied == []

    flaky.reject = False
    await page.click("button:text('Replay')")
    await page.wait_for_load_state()
    assert await page.locator("#letter-state").inner_text() == "REPLAYED"
    assert await page.locator("button:text('Replay')").count() == 0
    assert flaky.applied == [event_id]
    # Replayed again through the API (the same use case): still applied once.
    r = await live.http.post(f"/api/ops/dead-letters/{letter}/replay", headers=ADMIN)
    assert r.status_code == 200, r.text
    assert flaky.applied == [event_id]


async def test_forged_posts_on_the_actions_are_refused_and_change_nothing(
    page: Any, live: Live
) -> None:
    cat = category()
    live.container.scheduler.register(cat, Switch())
    scheduled = await _create_job(live, cat, datetime.now(UTC) + timedelta(hours=1))
    dead = await _create_job(live, cat, datetime.now(UTC) + timedelta(hours=1))
    async with live.container.db.connection() as conn:
        await conn.execute("UPDATE scheduled_job SET status = 'DEAD' WHERE id = $1", dead)
    body = {"category": cat, "cron": "0 3 * * *", "timezone": "UTC", "payload": {}}
    r = await live.http.post("/api/recurring-jobs", json=body, headers=SERVICE)
    assert r.status_code == 201, r.text
    recurring = r.json()["id"]
    flaky = Flaky(live, f"test-console-{uuid.uuid4().hex[:8]}")
    flaky_event, letter = await _park_one(live, flaky)
    flaky.reject = False  # a replay that got through would apply it

    await sign_in(page, live)
    await page.goto(f"{live.url}/console/jobs/{scheduled}")
    csrf = await page.locator("form.sign-out input[name=csrf]").get_attribute("value")
    actions = [
        f"/console/jobs/{dead}/retry",
        f"/console/jobs/{scheduled}/cancel",
        f"/console/dead-letters/{letter}/replay",
        f"/console/recurring-jobs/{recurring}/delete",
    ]
    for action in actions:
        # The session cookie, with a wrong or missing token, or the right one from another site.
        for form, headers in (
            ({"csrf": "forged"}, {}),
            ({}, {}),
            ({"csrf": csrf}, {"Origin": "https://evil.example"}),
        ):
            r = await page.request.post(
                f"{live.url}{action}", form=form, headers=headers, max_redirects=0
            )
            assert r.status == 403, (action, form, await r.text())
        # No session at all: sent to sign in.
        r2 = await live.http.post(action, data={"csrf": csrf})
        assert r2.status_code == 303 and r2.headers["location"].startswith("/console/sign-in")

    assert await _job_status(live, dead) == "DEAD"
    assert await _job_status(live, scheduled) == "SCHEDULED"
    r = await live.http.get(
        "/api/ops/dead-letters", params={"consumer": flaky.consumer}, headers=ADMIN
    )
    assert r.json()["items"][0]["replayedAt"] is None
    assert flaky.applied == []
    async with live.container.db.connection() as conn:
        assert await conn.fetchval("SELECT count(*) FROM recurring_job WHERE id = $1", recurring)

    # The same posts with the page's token do act (the refusals above were the CSRF check).
    r = await page.request.post(f"{live.url}/console/jobs/{scheduled}/cancel", form={"csrf": csrf})
    assert r.ok
    assert await _job_status(live, scheduled) == "CANCELLED"
    assert flaky_event not in flaky.applied


async def test_the_queues_refresh_themselves_and_bad_filters_are_said_in_words(
    page: Any, live: Live
) -> None:
    fragment = await live.http.get("/console/jobs/counts", headers={"HX-Request": "true"})
    assert fragment.status_code == 401 and fragment.headers["hx-redirect"] == "/console/sign-in"

    cat = category()
    live.container.scheduler.register(cat, Switch())
    await sign_in(page, live)
    await page.goto(f"{live.url}/console/jobs")
    assert await page.locator("#queues tr", has_text=cat).count() == 0
    # Due within the scheduler's window: handed to Redis at once, so it is queued.
    await _create_job(live, cat, datetime.now(UTC) + timedelta(seconds=1))
    # No reload: the counts panel refreshes itself (htmx) and shows its queue.
    await page.locator("#queues tr", has_text=cat).wait_for(timeout=15_000)

    r = await page.goto(f"{live.url}/console/jobs?status=dead&category=Not%20one")
    assert r is not None and r.status == 422
    alert = await page.locator("[role=alert]").inner_text()
    assert "No status 'dead'" in alert and "is not a category name" in alert
