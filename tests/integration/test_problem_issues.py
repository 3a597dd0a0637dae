"""What schemathesis found in the answers (issue 43): every 422's ``errors`` holds
at least one issue, each with its ``type`` and a ``loc`` that starts with the
part of the request it is in, as the document's Problem schema says (the cursor
of every list, a job's payload, runAt with delayMs, a rental period, a
webhook's body); a 405 names every method of its path in ``Allow`` (RFC 9110
§15.5.6), and a concrete path is not the template beside it
(``PATCH /api/jobs/retry`` is 405, not job "retry")."""

from __future__ import annotations

import uuid
from typing import Any

import httpx
import jsonschema
import orjson
import pytest

from reservo.app import openapi_document
from reservo.core.http.auth import sign_webhook
from reservo.core.kernel.clock import OffsetClock
from tests.helpers.auth import ADMIN, PAY_SECRET, auth, new_id
from tests.helpers.betting import post_result
from tests.helpers.rentals import at, make_car

_DOC = openapi_document()
_PROBLEM = jsonschema.Draft202012Validator(
    {"$ref": "#/components/schemas/Problem", "components": _DOC["components"]}
)


def issues(r: httpx.Response, status: int = 422) -> list[dict[str, Any]]:
    """The answer's ``errors``, once it is checked against the document's Problem."""
    assert r.status_code == status, r.text
    body = r.json()
    _PROBLEM.validate(body)  # type on every issue, loc's first item, never empty
    errors: list[dict[str, Any]] = body["errors"]
    return errors


@pytest.mark.parametrize(
    "path",
    [
        "/api/matches",
        "/api/jobs?category=http",
        "/api/ops/dead-letters",
        "/api/accounts?negative=true",
        "/api/patients/1/appointments",
    ],
)
async def test_a_malformed_cursor_names_the_query_and_its_type(
    client: httpx.AsyncClient, path: str
) -> None:
    sep = "&" if "?" in path else "?"
    r = await client.get(f"{path}{sep}after=not-a-cursor", headers=ADMIN)
    assert issues(r) == [
        {"loc": ["query", "after"], "msg": "malformed cursor", "type": "malformed_cursor"}
    ]


async def test_a_jobs_payload_issues_are_under_the_body(client: httpx.AsyncClient) -> None:
    body = {"category": "appointments.expire-hold", "payload": {}}
    r = await client.post("/api/jobs", json=body, headers=ADMIN)
    assert [(e["loc"], e["type"]) for e in issues(r)] == [
        (["body", "payload", "appointmentId"], "missing")
    ]
    r = await client.post(
        "/api/recurring-jobs",
        json={**body, "cron": "*/5 * * * *", "timezone": "UTC"},
        headers=ADMIN,
    )
    assert [(e["loc"], e["type"]) for e in issues(r)] == [
        (["body", "payload", "appointmentId"], "missing")
    ]


async def test_run_at_with_delay_ms_says_where(client: httpx.AsyncClient) -> None:
    payload = {"url": "https://example.com/", "method": "GET"}
    body = {"category": "http", "runAt": "2090-01-01T00:00:00Z", "delayMs": 5, "payload": payload}
    r = await client.post("/api/jobs", json=body, headers=ADMIN)
    assert [(e["loc"], e["type"]) for e in issues(r)] == [(["body", "delayMs"], "value_error")]
    r = await client.post("/api/jobs", json={"category": "Bad!"}, headers=ADMIN)
    assert issues(r)[0]["loc"][0] == "body"
    r = await client.post(
        "/api/jobs",
        json={**body, "delayMs": None, "runAt": "2099-01-01T00:00:00Z"},
        headers=ADMIN,
    )
    assert [e["loc"] for e in issues(r)] == [["body", "runAt"]]


async def test_a_rental_period_says_body_or_query(client: httpx.AsyncClient) -> None:
    car = await make_car(client)
    past, later = at(-48).isoformat(), at(-24).isoformat()
    customer = new_id()
    r = await client.post(
        "/api/bookings",
        json={"carId": car["id"], "customerId": customer, "from": past, "to": later},
        headers={**auth("customer", customer), "Idempotency-Key": str(uuid.uuid4())},
    )
    assert [e["loc"] for e in issues(r)] == [["body", "from"]]
    query = {"from": past, "to": later}
    r = await client.get(f"/api/cars/{car['id']}/quote", params=query, headers=ADMIN)
    assert [e["loc"] for e in issues(r)] == [["query", "from"]]
    r = await client.get("/api/cars", params={**query, "city": car["city"]}, headers=ADMIN)
    assert [e["loc"] for e in issues(r)] == [["query", "from"]]


async def test_a_webhooks_body_issues_are_under_the_body(
    client: httpx.AsyncClient, clock: OffsetClock
) -> None:
    raw = orjson.dumps({"bookingId": 1, "amount": 5, "status": "SUCCEEDED"})
    sig = sign_webhook(PAY_SECRET, raw, int(clock.now().timestamp()))
    r = await client.post(
        "/api/payments/webhook",
        content=raw,
        headers={"X-Signature": sig, "Content-Type": "application/json"},
    )
    assert ["body", "providerTxnId"] in [e["loc"] for e in issues(r)]
    r = await post_result(client, orjson.dumps({"homeScore": 1}), clock)
    assert ["body", "matchExternalId"] in [e["loc"] for e in issues(r)]


@pytest.mark.parametrize(
    ("method", "path", "allow"),
    [
        ("OPTIONS", "/api/jobs/1", "DELETE, GET, PATCH"),
        ("PUT", "/api/appointments/1", "DELETE, GET"),
        ("OPTIONS", "/api/webhook-endpoints/1", "DELETE, PATCH"),
        ("OPTIONS", "/healthz", "GET, HEAD"),
        ("PATCH", "/api/jobs/retry", "POST"),
        ("GET", "/api/jobs/retry", "POST"),
    ],
)
async def test_a_405_allows_every_method_of_its_path(
    client: httpx.AsyncClient, method: str, path: str, allow: str
) -> None:
    r = await client.request(method, path, headers=ADMIN)
    assert r.status_code == 405, r.text
    assert r.headers["allow"] == allow
    assert r.json()["code"] == "method_not_allowed"


async def test_the_concrete_path_still_serves_its_own_method(client: httpx.AsyncClient) -> None:
    body = {"status": "DEAD", "category": "http"}
    r = await client.post("/api/jobs/retry", json=body, headers=ADMIN)
    assert r.status_code == 200, r.text
    # An id no job has (other tests of the session create jobs 1, 2, ...): the
    # template still serves its own method, and answers it 404.
    r = await client.get("/api/jobs/9000000000000", headers=ADMIN)
    assert r.status_code == 404


@pytest.mark.parametrize(
    "path",
    ["/api/transfers", "/api/transfers/1/post", "/api/jobs", "/api/appointments"],
)
async def test_no_token_is_401_before_the_body_is_judged(
    client: httpx.AsyncClient, path: str
) -> None:
    """A body the JSON rules refuse (an integer past 64 bits) without a token is
    401: who may send it comes first (schemathesis: missing_required_header)."""
    raw = b'{"amount": 1180591620717411303424}'
    json_body = {"Content-Type": "application/json", "Idempotency-Key": "k-1"}
    for body in (raw, b"\xff\xfe{"):  # past 64 bits; not even UTF-8
        r = await client.post(path, content=body, headers=json_body)
        assert r.status_code == 401, r.text
        assert r.json()["code"] == "unauthenticated"
    r = await client.post(path, content=raw, headers={**json_body, **ADMIN})
    assert issues(r) == [
        {"loc": ["body"], "msg": "integers must fit in 64 bits", "type": "json_invalid"}
    ]


@pytest.mark.parametrize(
    ("method", "path"),
    [("DELETE", "/api/transfers/1/post"), ("GET", "/api/appointments/2/reschedule")],
)
async def test_a_method_no_route_takes_is_405_whatever_its_body(
    client: httpx.AsyncClient, method: str, path: str
) -> None:
    raw = b'{"amount": -1180591620717411303424}'
    headers = {**ADMIN, "Content-Type": "application/json"}
    r = await client.request(method, path, content=raw, headers=headers)
    assert r.status_code == 405, r.text
    assert r.headers["allow"] == "POST"
