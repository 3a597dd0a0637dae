"""Every JSON intake holds to one set of rules (core.http.schemas.read_json), free-form
fields included: a lone UTF-16 surrogate, an integer past 64 bits, NaN, a NUL are
422 `validation_error` on every route, the hot path's and FastAPI's, and change
nothing. Job payloads are checked per category at intake: `http` headers may not
reframe the request, an internal category's payload must fit the model its
handler reads it with, and only an admin creates internal jobs. A handler's
exception text never reaches `lastError`."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from datetime import UTC, datetime, timedelta
from typing import Any

import asyncpg
import httpx
import orjson
import pytest

from reservo.scheduler.domain import Job
from reservo.scheduler.workers import BAD_PAYLOAD, handler_failed, run
from reservo.settings import Settings
from tests.helpers.auth import auth, new_id
from tests.helpers.scheduler import Stack, api_stack, category
from tests.helpers.waiting import wait_until

SERVICE = auth("service", 1)
ADMIN = auth("admin", 1)
JSON = {"Content-Type": "application/json"}
FAR = (datetime.now(UTC) + timedelta(days=30)).isoformat()
HTTP_PAYLOAD = '{"url":"https://example.com/hook"'


def job(payload: str, cat: str = "http") -> bytes:
    return f'{{"category":"{cat}","runAt":"{FAR}","payload":{payload}}}'.encode()


def recurring(payload: str, cat: str = "http") -> bytes:
    body = f'"category":"{cat}","cron":"0 3 * * *","timezone":"UTC","payload":{payload}'
    return f"{{{body}}}".encode()


async def counts(db: asyncpg.Connection) -> tuple[int, int, int]:
    return (
        await db.fetchval("SELECT count(*) FROM scheduled_job"),
        await db.fetchval("SELECT count(*) FROM recurring_job"),
        await db.fetchval("SELECT count(*) FROM doctor"),
    )


def refused(r: httpx.Response, why: str) -> None:
    assert r.status_code == 422, r.text
    assert r.headers["content-type"].startswith("application/problem+json")
    assert r.json()["code"] == "validation_error"
    assert why in r.text, r.text


# -- one reader for every JSON body --------------------------------------------------------

SURROGATE = '"\\ud800"'
# (where, body, headers): a lone surrogate in a value or a key, on the hot path
# (POST /api/jobs) and through FastAPI.
SURROGATE_BODIES = [
    ("/api/jobs", job(f'{HTTP_PAYLOAD},"body":{SURROGATE}}}'), SERVICE),
    ("/api/jobs", job(f'{HTTP_PAYLOAD},"body":{{"\\udc00":1}}}}'), SERVICE),
    ("/api/jobs", job(f'{{"x":{SURROGATE}}}', "rentals.expire-hold"), ADMIN),
    (
        "/api/recurring-jobs",
        recurring(f'{HTTP_PAYLOAD},"headers":{{"X-A":{SURROGATE}}}}}'),
        SERVICE,
    ),
    ("/api/doctors", f'{{"name":{SURROGATE},"timezone":"UTC"}}'.encode(), ADMIN),
    ("/api/doctors", b'{"name":"Dr. A","timezone":"UTC","x\\ud800":1}', ADMIN),
    ("/api/cars", f'{{"plate":{SURROGATE},"model":"m","city":"c","dailyPrice":1}}'.encode(), ADMIN),
    ("/api/accounts", f'{{"currency":{SURROGATE}}}'.encode(), ADMIN),
    ("/api/bookings", f'{{"carId":1,"from":{SURROGATE}}}'.encode(), auth("customer", 7)),
    # Before its signature is checked: the body is not JSON reservo reads. (With
    # no X-Signature at all it is 401 first, as a request without a token.)
    (
        "/api/payments/webhook",
        f'{{"bookingId":1,"status":{SURROGATE}}}'.encode(),
        {"X-Signature": "t=1,v1=00"},
    ),
]


@pytest.mark.parametrize(("path", "body", "headers"), SURROGATE_BODIES)
async def test_a_lone_surrogate_is_422_at_every_json_intake(
    client: httpx.AsyncClient, db: asyncpg.Connection, path: str, body: bytes, headers: Any
) -> None:
    before = await counts(db)
    r = await client.post(path, content=body, headers={**headers, **JSON})
    refused(r, "surrogate")
    assert await counts(db) == before


async def test_a_query_string_cannot_carry_a_surrogate(client: httpx.AsyncClient) -> None:
    # Percent-decoding replaces the bytes of one (U+FFFD): an ordinary refusal.
    r = await client.get("/api/jobs?category=%ED%A0%80", headers=SERVICE)
    assert (r.status_code, r.json()["code"]) == (422, "validation_error"), r.text


@pytest.mark.parametrize(
    ("payload", "why"),
    [
        ('{"n":18446744073709551616}', "64 bits"),
        ('{"n":-9223372036854775809}', "64 bits"),
        ('{"n":[1,2,{"m":123456789012345678901234567890}]}', "64 bits"),
        ('{"n":NaN}', "finite"),
        ('{"n":"a\\u0000b"}', "NUL"),
    ],
    ids=["2^64", "-2^63-1", "nested-wide", "nan", "nul"],
)
async def test_free_form_payloads_hold_to_the_json_rules(
    client: httpx.AsyncClient, db: asyncpg.Connection, payload: str, why: str
) -> None:
    before = await counts(db)
    for path, body in (
        ("/api/jobs", job(f'{HTTP_PAYLOAD},"body":{payload}}}')),
        ("/api/recurring-jobs", recurring(f'{HTTP_PAYLOAD},"body":{payload}}}')),
    ):
        refused(await client.post(path, content=body, headers={**SERVICE, **JSON}), why)
    assert await counts(db) == before


async def test_the_64_bit_edges_and_real_floats_are_accepted(client: httpx.AsyncClient) -> None:
    body = "[18446744073709551615, -9223372036854775808, 1e30, -2.5e300]"
    r = await client.post(
        "/api/jobs", content=job(f'{HTTP_PAYLOAD},"body":{body}}}'), headers={**SERVICE, **JSON}
    )
    assert r.status_code == 201, r.text
    await client.delete(f"/api/jobs/{r.json()['jobId']}", headers=SERVICE)


# -- http job headers ----------------------------------------------------------------------

BAD_HEADERS: list[tuple[str, str]] = [
    ("Transfer-Encoding", "chunked"),
    ("content-length", "0"),
    ("Connection", "close"),
    ("Host", "internal.example"),
    ("Keep-Alive", "timeout=5"),
    ("TE", "trailers"),
    ("Trailer", "X-A"),
    ("Upgrade", "h2c"),
    ("Proxy-Authorization", "Basic eA=="),
    ("Proxy-Connection", "keep-alive"),
    ("Expect", "100-continue"),
    ("idempotency-key", "mine"),
    ("X-A", "a\r\nX-Smuggled: 1"),
    ("X-A", "a\nb"),
    ("X-A", "caf\u00e9"),
    ("X-A", "a\x01b"),
    ("X-A", " leading"),
    ("X A", "name with a space"),
    ("X-A:", "colon"),
    ("", "empty name"),
    ("X-\u00e9", "non-ASCII name"),
]


@pytest.mark.parametrize(("name", "value"), BAD_HEADERS)
async def test_http_jobs_may_not_set_framing_headers_or_odd_values(
    client: httpx.AsyncClient, db: asyncpg.Connection, name: str, value: str
) -> None:
    payload = {"url": "https://example.com/hook", "headers": {name: value}}
    before = await counts(db)
    for path, body in (
        ("/api/jobs", {"category": "http", "runAt": FAR, "payload": payload}),
        (
            "/api/recurring-jobs",
            {"category": "http", "cron": "0 3 * * *", "timezone": "UTC", "payload": payload},
        ),
    ):
        r = await client.post(path, content=orjson.dumps(body), headers={**SERVICE, **JSON})
        refused(r, "header")
        assert r.json()["errors"][0]["loc"][:3] == ["body", "payload", "headers"], r.text
    assert await counts(db) == before


async def test_ordinary_headers_are_accepted(client: httpx.AsyncClient) -> None:
    headers = {"Authorization": "Bearer abc.def", "X-Trace": "a b\tc", "Content-Type": "text/x"}
    payload = {"url": "https://example.com/hook", "headers": headers}
    r = await client.post(
        "/api/jobs", json={"category": "http", "runAt": FAR, "payload": payload}, headers=SERVICE
    )
    assert r.status_code == 201, r.text
    await client.delete(f"/api/jobs/{r.json()['jobId']}", headers=SERVICE)


# -- internal categories -------------------------------------------------------------------

INTERNAL = [("rentals.expire-hold", "bookingId"), ("appointments.reminder", "appointmentId")]


@pytest.mark.parametrize(("cat", "field"), INTERNAL)
async def test_internal_categories_are_admin_only(
    client: httpx.AsyncClient, db: asyncpg.Connection, cat: str, field: str
) -> None:
    before = await counts(db)
    good = f'{{"{field}":{2**62}}}'
    for path, body in (
        ("/api/jobs", job(good, cat)),
        ("/api/recurring-jobs", recurring(good, cat)),
    ):
        for who in (SERVICE, auth("patient", new_id()), auth("customer", new_id())):
            r = await client.post(path, content=body, headers={**who, **JSON})
            assert (r.status_code, r.json()["code"]) == (403, "forbidden"), r.text
    assert await counts(db) == before


@pytest.mark.parametrize(("cat", "field"), INTERNAL)
@pytest.mark.parametrize(
    "payload",
    ["{}", '{"FIELD":"7"}', '{"FIELD":0}', '{"FIELD":9223372036854775808}', '{"FIELD":1,"x":1}'],
    ids=["missing", "string", "zero", "past-bigint", "extra"],
)
async def test_internal_payloads_must_fit_the_handlers_model(
    client: httpx.AsyncClient, db: asyncpg.Connection, cat: str, field: str, payload: str
) -> None:
    before = await counts(db)
    body = payload.replace("FIELD", field)
    for path, raw in (("/api/jobs", job(body, cat)), ("/api/recurring-jobs", recurring(body, cat))):
        r = await client.post(path, content=raw, headers={**ADMIN, **JSON})
        refused(r, f"bad payload for category {cat}")
        assert r.json()["errors"][0]["loc"][:2] == ["body", "payload"]
    assert await counts(db) == before


@pytest.mark.parametrize(("cat", "field"), INTERNAL)
async def test_an_admin_creates_an_internal_job_with_a_fitting_payload(
    client: httpx.AsyncClient, cat: str, field: str
) -> None:
    r = await client.post(
        "/api/jobs",
        json={"category": cat, "runAt": FAR, "payload": {field: 2**62}},
        headers=ADMIN,
    )
    assert r.status_code == 201, r.text
    await client.delete(f"/api/jobs/{r.json()['jobId']}", headers=ADMIN)


# -- lastError stays generic ---------------------------------------------------------------


@pytest.fixture
async def s(own_database: str, base_settings: Settings) -> AsyncIterator[Stack]:
    async with api_stack(base_settings, own_database) as stack:
        yield stack


async def _job(client: httpx.AsyncClient, job_id: int) -> dict[str, Any]:
    r = await client.get(f"/api/jobs/{job_id}", headers=SERVICE)
    assert r.status_code == 200, r.text
    body: dict[str, Any] = r.json()
    return body


async def test_last_error_never_shows_a_handlers_exception_text(s: Stack) -> None:
    sched = s.container.scheduler
    cat = category()
    secret = "password=hunter2 at 10.0.0.7"

    async def leaky(_: Job) -> None:
        raise RuntimeError(secret)

    sched.register(cat, leaky)
    r = await s.client.post("/api/jobs", json={"category": cat, "payload": {}}, headers=SERVICE)
    assert r.status_code == 201, r.text
    failed = int(r.json()["jobId"])
    # A payload the category's model refuses, written before the intake checked
    # it (the jobs API refuses it now): DEAD at once, not retried.
    stale = int(
        await s.db.fetchval(
            "INSERT INTO scheduled_job (category, urgency, run_at, payload, max_attempts, "
            "created_at, status, pushed) VALUES ('rentals.expire-hold', 5, now(), "
            """'{"bookingId": "DROP TABLE"}', 3, now(), 'SCHEDULED', false) RETURNING id"""
        )
    )
    stop = asyncio.Event()
    workers = asyncio.create_task(run(sched, stop))
    try:

        async def settled() -> bool:
            a, b = await _job(s.client, failed), await _job(s.client, stale)
            return a["attempts"] >= 1 and a["lastError"] is not None and b["status"] == "DEAD"

        await wait_until(settled, 30, step_s=0.1)
    finally:
        stop.set()
        await asyncio.wait_for(workers, 30)
    first = await _job(s.client, failed)
    assert first["lastError"].startswith("the job's handler failed (attempt ")
    assert first["lastError"] in {handler_failed(n) for n in range(1, 4)}
    dead = await _job(s.client, stale)
    assert (dead["lastError"], dead["attempts"]) == (BAD_PAYLOAD, 1)
    for job_id, text in ((failed, secret), (stale, "DROP TABLE")):
        assert text not in orjson.dumps(await _job(s.client, job_id)).decode()
        # The detail is kept for operators, in the execution log.
        logged = await s.db.fetchval(
            "SELECT error FROM job_execution WHERE job_id = $1 ORDER BY attempt LIMIT 1", job_id
        )
        assert text in logged
