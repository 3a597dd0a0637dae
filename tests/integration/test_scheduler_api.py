"""The Delayed jobs HTTP API: auth, shapes and error codes (docs/openapi.json)."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import asyncpg
import httpx

from tests.helpers.auth import auth, new_id

SERVICE = auth("service", 1)
FAR = (datetime.now(UTC) + timedelta(days=30)).isoformat()
HTTP_JOB = {"category": "http", "urgency": 3, "runAt": FAR, "payload": {"url": "http://x.test/"}}


async def _create(client: httpx.AsyncClient, body: dict[str, object] | None = None) -> int:
    r = await client.post("/api/jobs", json=body or HTTP_JOB, headers=SERVICE)
    assert r.status_code == 201, r.text
    return int(r.json()["jobId"])


async def test_create_get_and_cancel(client: httpx.AsyncClient) -> None:
    r = await client.post("/api/jobs", json=HTTP_JOB, headers=SERVICE)
    assert r.status_code == 201, r.text
    body = r.json()
    assert body["status"] == "SCHEDULED"
    assert datetime.fromisoformat(body["runAt"]) == datetime.fromisoformat(FAR)
    got = await client.get(f"/api/jobs/{body['jobId']}", headers=auth("admin", 1))
    assert got.status_code == 200
    job = got.json()
    assert job["category"] == "http" and job["urgency"] == 3 and job["attempts"] == 0
    assert {"startedAt", "finishedAt", "lastError"} <= set(job)
    cancelled = await client.delete(f"/api/jobs/{body['jobId']}", headers=SERVICE)
    assert cancelled.status_code == 200 and cancelled.json()["status"] == "CANCELLED"
    again = await client.delete(f"/api/jobs/{body['jobId']}", headers=SERVICE)
    assert again.status_code == 200 and again.json()["status"] == "CANCELLED"


async def test_delay_ms_sets_run_at(client: httpx.AsyncClient) -> None:
    before = datetime.now(UTC)
    r = await client.post(
        "/api/jobs",
        json={"category": "http", "delayMs": 3_600_000, "payload": {"url": "http://x.test/"}},
        headers=SERVICE,
    )
    assert r.status_code == 201
    run_at = datetime.fromisoformat(r.json()["runAt"])
    assert timedelta(minutes=59) < run_at - before < timedelta(minutes=61)
    await client.delete(f"/api/jobs/{r.json()['jobId']}", headers=SERVICE)


async def test_only_service_and_admin(client: httpx.AsyncClient) -> None:
    assert (await client.post("/api/jobs", json=HTTP_JOB)).status_code == 401
    for role in ("patient", "customer", "doctor", "bettor", "host"):
        r = await client.post("/api/jobs", json=HTTP_JOB, headers=auth(role, new_id()))
        assert r.status_code == 403 and r.json()["code"] == "forbidden"
    job_id = await _create(client)
    r = await client.get(f"/api/jobs/{job_id}", headers=auth("patient", new_id()))
    assert r.status_code == 403
    r = await client.delete(f"/api/jobs/{job_id}", headers=auth("patient", new_id()))
    assert r.status_code == 403
    assert (await client.get(f"/api/jobs/{job_id}")).status_code == 401
    r = await client.post("/api/jobs", json=HTTP_JOB, headers=auth("admin", 1))
    assert r.status_code == 201
    for j in (job_id, r.json()["jobId"]):
        await client.delete(f"/api/jobs/{j}", headers=SERVICE)


async def test_not_found_and_not_cancellable(
    client: httpx.AsyncClient, db: asyncpg.Connection
) -> None:
    for method in ("GET", "DELETE"):
        r = await client.request(method, "/api/jobs/999999999999", headers=SERVICE)
        assert r.status_code == 404 and r.json()["code"] == "job_not_found"
    job_id = await _create(client)
    await db.execute("UPDATE scheduled_job SET status = 'DONE' WHERE id = $1", job_id)
    r = await client.delete(f"/api/jobs/{job_id}", headers=SERVICE)
    assert r.status_code == 409 and r.json()["code"] == "not_cancellable"
    assert (await client.get(f"/api/jobs/{job_id}", headers=SERVICE)).json()["status"] == "DONE"


async def test_bad_input_is_422_and_creates_nothing(
    client: httpx.AsyncClient, db: asyncpg.Connection
) -> None:
    before = await db.fetchval("SELECT count(*) FROM scheduled_job")
    bad = [
        ({**HTTP_JOB, "category": "no.such.handler"}, "unknown_category"),
        ({**HTTP_JOB, "urgency": 10}, "validation_error"),
        ({**HTTP_JOB, "urgency": -1}, "validation_error"),
        ({**HTTP_JOB, "urgency": "5"}, "validation_error"),
        ({**HTTP_JOB, "delayMs": 5}, "validation_error"),  # runAt and delayMs
        ({**HTTP_JOB, "runAt": "2026-01-01T08:00:00"}, "validation_error"),  # no offset
        ({**HTTP_JOB, "runAt": "9999-01-01T08:00:00+00:00"}, "validation_error"),
        ({**HTTP_JOB, "runAt": "not a date"}, "validation_error"),
        ({"category": "http", "delayMs": -1, "payload": {"url": "http://x/"}}, "validation_error"),
        ({**HTTP_JOB, "payload": {"url": "not a url"}}, "validation_error"),
        ({**HTTP_JOB, "payload": {}}, "validation_error"),
        ({**HTTP_JOB, "payload": "text"}, "validation_error"),
        ({**HTTP_JOB, "category": "BAD CAT"}, "validation_error"),
        ({**HTTP_JOB, "extra": 1}, "validation_error"),
    ]
    for body, code in bad:
        r = await client.post("/api/jobs", json=body, headers=SERVICE)
        assert r.status_code == 422, (body, r.text)
        assert r.json()["code"] == code, (body, r.text)
    r = await client.post("/api/jobs", content=b"{nope", headers=SERVICE)
    assert r.status_code == 422
    r = await client.get("/api/jobs/abc", headers=SERVICE)
    assert r.status_code == 422
    assert await db.fetchval("SELECT count(*) FROM scheduled_job") == before


async def test_idempotency_key_replays_the_same_job(client: httpx.AsyncClient) -> None:
    headers = {**auth("service", new_id()), "Idempotency-Key": f"job-{new_id()}"}
    first = await client.post("/api/jobs", json=HTTP_JOB, headers=headers)
    second = await client.post("/api/jobs", json=HTTP_JOB, headers=headers)
    assert first.status_code == 201 and second.status_code == 200
    assert first.json() == second.json()
    other = await client.post("/api/jobs", json={**HTTP_JOB, "urgency": 1}, headers=headers)
    assert other.status_code == 422 and other.json()["code"] == "idempotency_key_reused"
    await client.delete(f"/api/jobs/{first.json()['jobId']}", headers=SERVICE)


async def test_run_at_outside_the_accepted_range_is_422_and_stores_nothing(
    client: httpx.AsyncClient, db: asyncpg.Connection
) -> None:
    # Year 1 was once stored (500, but committed) and stalled the loader: year 1
    # at an offset is year 0 in UTC, which no worker could decode.
    before = await db.fetchval("SELECT count(*) FROM scheduled_job")
    for run_at in (
        "0001-01-01T00:00:00Z",
        "0001-01-01T00:00:00+05:00",
        "1999-12-31T23:59:59Z",
        "9999-12-31T23:59:59Z",
        "2100-01-01T00:00:00Z",
    ):
        r = await client.post("/api/jobs", json={**HTTP_JOB, "runAt": run_at}, headers=SERVICE)
        assert r.status_code == 422, (run_at, r.text)
        assert r.json()["code"] == "validation_error"
    assert await db.fetchval("SELECT count(*) FROM scheduled_job") == before
