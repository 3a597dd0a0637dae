"""Every console page in a real headless Chromium, checked by axe-core with
all its rules (no tag filter): no violation of any impact, and no resource the
page loads answers 4xx/5xx.

The pages are the console's GET routes as the app declares them, so a new page
is checked without touching this test; path ids are those of real objects made
here (the demo data, a job, a dead letter, an appointment, a webhook endpoint).
axe-core comes from npm into a cache directory (scripts/install-browser.sh);
without it the test is skipped loudly, like the browser tests without Chromium."""

from __future__ import annotations

import asyncio
import os
import uuid
from collections.abc import AsyncIterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
from fastapi.routing import APIRoute

from reservo import demo
from reservo.bootstrap import ALL, run_workers
from reservo.core.messaging.failures import Rejected
from reservo.core.messaging.outbox import emit
from reservo.core.messaging.transport.base import Event
from reservo.scheduler.domain import Job
from reservo.settings import Settings
from tests.helpers.auth import ADMIN, auth
from tests.helpers.browser import Live, booked_slot, serve, sign_in
from tests.helpers.scheduler import category
from tests.helpers.waiting import wait_until

SERVICE = auth("service", 1)
TOPIC = "test.console-a11y.v1"
# Where scripts/install-browser.sh puts axe-core (npm install --prefix DIR axe-core).
AXE_DIR = Path(os.environ.get("AXE_CORE_DIR", Path.home() / ".cache" / "reservo" / "axe-core"))
AXE = AXE_DIR / "node_modules" / "axe-core" / "axe.min.js"
# htmx fragments a page swaps into itself: checked as part of that page.
FRAGMENTS = {"/console/overview/panels": "/console", "/console/jobs/counts": "/console/jobs"}


@pytest.fixture
async def demo_live(base_settings: Settings, own_database: str) -> AsyncIterator[Live]:
    settings = demo.settings_for_demo(
        base_settings.with_(
            database_url=own_database,
            redis_namespace=f"a11y-{uuid.uuid4().hex[:8]}",
            jobs_http_allow="127.0.0.1",  # the webhook endpoint below
        )
    )
    async for running in serve(settings):
        running.doctors = await demo.load(running.container)
        stop = asyncio.Event()
        workers = asyncio.create_task(run_workers(running.container, [ALL], stop))
        yield running
        stop.set()
        await workers


@pytest.fixture
async def page(browser: Any) -> AsyncIterator[Any]:
    # The console's CSP refuses inline scripts, which is how axe is injected;
    # bypassing it here changes nothing else the page loads.
    context = await browser.new_context(viewport={"width": 1280, "height": 900}, bypass_csp=True)
    p = await context.new_page()
    p.set_default_timeout(15_000)
    yield p
    await context.close()


def _axe() -> Path:
    if not AXE.is_file():
        pytest.skip(
            f"!!! NO axe-core AT {AXE}: the console's accessibility test did NOT run. "
            "Run scripts/install-browser.sh (needs npm) !!!"
        )
    return AXE


async def _never_run(job: Job) -> None:
    raise AssertionError("the job is due in an hour")


async def _objects(live: Live) -> dict[str, str]:
    """Real ids for every path parameter of a console GET route."""

    async def reject(event: Event) -> None:
        raise Rejected("refused for the accessibility test")

    live.container.subscriptions.add(f"test-a11y-{uuid.uuid4().hex[:8]}", [TOPIC], reject)
    doctor, day, slot, appointment = await booked_slot(live)
    appt = await live.http.get(f"/api/appointments/{appointment}", headers=ADMIN)
    assert appt.status_code == 200, appt.text
    patient = str(appt.json()["patientId"])
    async with live.container.db.connection() as conn:
        car = await conn.fetchval("SELECT min(id) FROM car")
    cat = category()
    live.container.scheduler.register(cat, _never_run)
    job = await live.http.post(
        "/api/jobs",
        json={
            "category": cat,
            "runAt": (datetime.now(UTC) + timedelta(hours=1)).isoformat(),
            "payload": {},
        },
        headers=SERVICE,
    )
    assert job.status_code == 201, job.text
    hook = await live.http.post(
        "/api/webhook-endpoints",
        json={"url": "http://127.0.0.1:9/hook", "events": ["appointments.appointment.booked.v1"]},
        headers=ADMIN,
    )
    assert hook.status_code == 201, hook.text
    async with live.container.db.transaction() as conn:
        await emit(conn, TOPIC, "k", {"n": 1}, live.container.clock.now())

    async def parked() -> bool:
        r = await live.http.get("/api/ops/dead-letters", headers=ADMIN)
        return bool(r.json()["items"])

    await wait_until(parked, 20)
    letters = (await live.http.get("/api/ops/dead-letters", headers=ADMIN)).json()["items"]
    return {
        "job_id": str(job.json()["jobId"]),
        "letter_id": str(letters[0]["id"]),
        "endpoint_id": str(hook.json()["id"]),
        "appointment": str(appointment),
        "slot": str(slot),
        "doctor": str(doctor),
        "day": day.isoformat(),
        "patient": patient,
        "car": str(car),
        "customer": patient,
    }


# Query strings that make a page show its content rather than its empty form.
QUERIES = {
    "/console/clinic": "doctor={doctor}&day={day}",
    "/console/clinic/appointments": "patient={patient}",
    "/console/rentals": "car={car}",
    "/console/rentals/bookings": "customer={customer}",
    "/console/people": "q={patient}",
    "/console/find": "what=doctor&q=Dr",
    "/console/clinic/doctors": "q=Dr",
    "/console/rentals/cars": "q=a",
    "/console/betting/matches": "q=a",
    "/console/betting": "status=UPCOMING",
}
# A desktop and a phone: what overflows, and must scroll, differs.
WINDOWS = ((1280, 900), (390, 844))
# What a page makes the browser fetch: its links, scripts and images, and the
# icon (/favicon.ico when the page names none). Fetched again by the test, as
# Chromium reports no response event for the icon.
REFERENCED = """() => {
  const urls = [...document.querySelectorAll("link[href], script[src], img[src]")]
    .map(e => e.href || e.src).filter(u => !u.startsWith("data:"));
  if (!document.querySelector("link[rel~=icon]")) urls.push(new URL("/favicon.ico", location).href);
  return urls;
}"""
# The overview's panels wider than their card (a column out of sight).
OVERFLOWING = """() => [...document.querySelectorAll(".card")]
  .filter(c => c.scrollWidth > c.clientWidth)
  .map(c => c.getAttribute("aria-labelledby") || c.id)"""
# Path parameters whose name alone does not say which object they are.
PATH_IDS = {
    "/console/clinic/appointments/{id}/cancel": "appointment",
    "/console/clinic/slots/{id}/waitlist": "slot",
}


def _pages(live: Live, ids: dict[str, str]) -> list[str]:
    """Every console GET route (but the static assets) as a URL to open, as
    tests/integration/test_idem_rules.py reads the API's routes."""
    paths = [
        route.path
        for module in live.container.modules
        for router in module.routers
        for route in router.routes
        if isinstance(route, APIRoute) and "GET" in (route.methods or ())
    ]
    urls = []
    for path in paths:
        if not path.startswith("/console") or path.startswith("/console/static"):
            continue
        if path in FRAGMENTS:
            assert FRAGMENTS[path] in paths
            continue
        url = path.replace("{id}", ids[PATH_IDS[path]]) if path in PATH_IDS else path
        url = url.format(**ids)
        if path in QUERIES:
            url += "?" + QUERIES[path].format(**ids)
        urls.append(url)
    return urls


async def _axe_violations(page: Any, axe: Path) -> list[str]:
    await page.add_script_tag(path=str(axe))
    result = await page.evaluate("axe.run()")
    return [
        f"{v['id']} ({v['impact']}): {v['help']} at "
        + ", ".join(str(n["target"]) for n in v["nodes"])
        for v in result["violations"]
    ]


async def test_every_console_page_has_no_axe_violation_and_no_failing_resource(
    page: Any, demo_live: Live
) -> None:
    axe = _axe()
    live = demo_live
    ids = await _objects(live)
    failing: list[str] = []
    page.on(
        "response",
        lambda r: (
            failing.append(f"{r.status} {r.url} (on {page.url})") if r.status >= 400 else None
        ),
    )
    found: dict[str, list[str]] = {}
    clipped: dict[int, list[str]] = {}
    sideways: list[str] = []
    # Signed out: the sign-in page as everyone first sees it.
    await page.goto(f"{live.url}/console/sign-in")
    found["/console/sign-in (signed out)"] = await _axe_violations(page, axe)
    await sign_in(page, live)
    urls = _pages(live, ids)
    assert len(urls) >= 15, urls
    for width, height in WINDOWS:
        await page.set_viewport_size({"width": width, "height": height})
        for url in urls:
            response = await page.goto(live.url + url)
            assert response is not None and response.status == 200, (url, response.status)
            await page.wait_for_load_state("networkidle")
            found[f"{url} at {width}px"] = await _axe_violations(page, axe)
            if url == "/console":
                clipped[width] = await page.evaluate(OVERFLOWING)
            # Wide tables scroll inside their card; the page itself never sideways.
            if await page.evaluate("document.documentElement.scrollWidth") > width:
                sideways.append(f"{url} at {width}px")
            for resource in await page.evaluate(REFERENCED):
                r = await live.http.get(resource)
                if r.status_code >= 400:
                    failing.append(f"{r.status_code} {resource} (referenced by {url})")
    report = {url: v for url, v in found.items() if v}
    said = "\n".join(f"{u}:\n  " + "\n  ".join(v) for u, v in report.items())
    assert (report, failing) == ({}, []), said + "\n" + "\n".join(failing)
    # The overview is read at a glance: none of its panels hides a column.
    assert clipped == {width: [] for width, _ in WINDOWS}
    assert sideways == []
