"""The console's jobs page over HTTP: the category overview, pause/resume, the
rate limit form and the bulk retry of DEAD jobs, each a POST form that needs the
session's CSRF token (refused without it, and nothing changes). The browser
journey is in tests/browser/test_console_job_categories.py."""

from __future__ import annotations

import re
from datetime import UTC, datetime, timedelta

import httpx

from reservo.bootstrap import Container
from tests.helpers.auth import auth, token
from tests.helpers.console import sign_in
from tests.helpers.scheduler import Recorder, category

SERVICE = auth("service", 1)


async def _csrf(client: httpx.AsyncClient) -> str:
    page = await client.get("/console/jobs")
    assert page.status_code == 200, page.text
    found = re.search(r'name="csrf" value="([^"]+)"', page.text)
    assert found is not None
    return found[1]


async def _row(client: httpx.AsyncClient, cat: str) -> str:
    page = await client.get("/console/jobs")
    found = re.search(rf'<tr data-category="{re.escape(cat)}">(.*?)</tr>', page.text, re.S)
    assert found is not None, page.text
    return found[1]


async def _paused(container: Container, cat: str) -> bool | None:
    async with container.db.connection() as conn:
        got: bool | None = await conn.fetchval(
            "SELECT paused FROM job_category WHERE category = $1", cat
        )
    return got


async def test_pause_resume_and_rate_limit_from_the_jobs_page(
    client: httpx.AsyncClient, container: Container
) -> None:
    cat = category()
    container.scheduler.register(cat, Recorder())
    await sign_in(client, token("admin", 1))
    row = await _row(client, cat)
    assert "running" in row and f"/console/job-categories/{cat}/pause" in row
    csrf = await _csrf(client)

    # Without the token (or from another site): refused, nothing changes.
    assert (await client.post(f"/console/job-categories/{cat}/pause")).status_code == 403
    r = await client.post(
        f"/console/job-categories/{cat}/pause",
        data={"csrf": csrf},
        headers={"Origin": "http://evil.example"},
    )
    assert r.status_code == 403
    r = await client.post(f"/console/job-categories/{cat}/rate-limit", data={"per_second": "5"})
    assert r.status_code == 403
    assert await _paused(container, cat) is None

    r = await client.post(f"/console/job-categories/{cat}/pause", data={"csrf": csrf})
    assert (r.status_code, r.headers["location"]) == (303, "/console/jobs#categories-h")
    assert await _paused(container, cat) is True
    row = await _row(client, cat)
    assert "PAUSED" in row and f"/console/job-categories/{cat}/resume" in row

    r = await client.post(
        f"/console/job-categories/{cat}/rate-limit", data={"csrf": csrf, "per_second": "12.5"}
    )
    assert r.status_code == 303
    assert 'value="12.5"' in await _row(client, cat)
    for bad in ("0", "-3", "abc", "1e9", "nan", "inf"):
        r = await client.post(
            f"/console/job-categories/{cat}/rate-limit", data={"csrf": csrf, "per_second": bad}
        )
        assert r.status_code == 422, bad
        assert "Refused" in r.text
    assert 'value="12.5"' in await _row(client, cat)  # unchanged by the refusals
    r = await client.post(
        f"/console/job-categories/{cat}/rate-limit", data={"csrf": csrf, "per_second": ""}
    )
    assert r.status_code == 303
    assert 'placeholder="no limit"' in await _row(client, cat)
    assert 'value=""' in await _row(client, cat)

    r = await client.post(f"/console/job-categories/{cat}/resume", data={"csrf": csrf})
    assert r.status_code == 303
    assert await _paused(container, cat) is False
    api = await client.get("/api/job-categories", headers=SERVICE)
    mine = [c for c in api.json() if c["category"] == cat]
    assert mine == [
        {"category": cat, "paused": False, "perSecond": None, "due": 0, "running": 0, "dead": 0}
    ]


async def test_bulk_retry_of_dead_jobs_from_the_jobs_page(
    client: httpx.AsyncClient, container: Container
) -> None:
    cat = category()
    container.scheduler.register(cat, Recorder())
    ids = []
    for _ in range(3):
        body = {
            "category": cat,
            "runAt": (datetime.now(UTC) + timedelta(hours=1)).isoformat(),
            "payload": {},
        }
        r = await client.post("/api/jobs", json=body, headers=SERVICE)
        ids.append(int(r.json()["jobId"]))
    async with container.db.connection() as conn:
        await conn.execute("UPDATE scheduled_job SET status = 'DEAD' WHERE id = ANY($1)", ids)
    await sign_in(client, token("admin", 1))
    row = await _row(client, cat)
    assert "Retry 3 DEAD" in row
    csrf = await _csrf(client)
    r = await client.post("/console/jobs/retry-dead", data={"category": cat})
    assert r.status_code == 403
    r = await client.post("/console/jobs/retry-dead", data={"csrf": csrf, "category": cat})
    assert r.status_code == 303
    assert r.headers["location"] == "/console/jobs?retried=3#categories-h"
    page = await client.get(r.headers["location"].split("#")[0])
    assert "Retried 3 DEAD jobs." in page.text
    assert "Retry 3 DEAD" not in await _row(client, cat)
    for job in ids:
        got = await client.get(f"/api/jobs/{job}", headers=SERVICE)
        assert got.json()["status"] in ("SCHEDULED", "QUEUED")
    r = await client.post("/console/jobs/retry-dead", data={"csrf": csrf, "category": "BAD CAT"})
    assert r.status_code == 422 and "Refused" in r.text
