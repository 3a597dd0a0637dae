"""The lean path of POST /api/transfers and POST /api/jobs answers exactly as
their FastAPI routes: each scenario runs against an app with the lean path (whose
FastAPI authentication fails the test on these two routes, so the lean path must
have answered) and one without, and the answers must match in status, body (ids
aside) and headers. Requests outside the lean shape are FastAPI's."""

from __future__ import annotations

import re
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from typing import Annotated, Any

import httpx
import pytest
from fastapi import Header, Request

from reservo.app import create_app
from reservo.bootstrap import build
from reservo.core.auth import Principal
from reservo.core.clock import OffsetClock
from reservo.core.http import current_principal
from reservo.settings import Settings
from tests.helpers.auth import auth, new_id
from tests.helpers.betting import make_account
from tests.helpers.lean import shape

LEAN = {("POST", "/api/transfers"), ("POST", "/api/jobs")}
SERVICE = auth("service", 1)
OWN_FIELDS = ("fromAccountId", "toAccountId", "jobId", "runAt")
Scenario = Callable[[httpx.AsyncClient], Awaitable[list[httpx.Response]]]


async def _lean_must_answer(
    request: Request, authorization: Annotated[str | None, Header()] = None
) -> Principal:
    if (request.method, request.url.path) in LEAN:
        raise AssertionError("the lean path should have answered this request")
    return await current_principal(request, authorization)


@asynccontextmanager
async def _client(settings: Settings, lean: bool, strict: bool) -> AsyncIterator[httpx.AsyncClient]:
    container = build(settings.model_copy(update={"lean_paths": lean}), OffsetClock())
    app = create_app(container)
    if strict:
        app.dependency_overrides[current_principal] = _lean_must_answer
    try:
        async with httpx.AsyncClient(
            transport=httpx.ASGITransport(app=app), base_url="http://reservo.test"
        ) as c:
            yield c
    finally:
        await container.close()


def _masked(r: httpx.Response) -> tuple[int, Any, dict[str, str]]:
    """``shape`` (tests/helpers/lean.py) with this module's own ids masked too
    (accounts, jobs, times), and the digits of a detail (it may name the caller's
    account)."""
    status, body, headers = shape(r)
    if isinstance(body, dict):
        body = {k: ("<id>" if k in OWN_FIELDS else v) for k, v in body.items()}
        if isinstance(body.get("detail"), str):
            body["detail"] = re.sub(r"[0-9]+", "N", body["detail"])
    return status, body, headers


def _key(headers: dict[str, str], key: str | None = None) -> dict[str, str]:
    return {**headers, "Idempotency-Key": key or str(uuid.uuid4())}


async def s_transfers(c: httpx.AsyncClient) -> list[httpx.Response]:
    source, owner = await make_account(c, 100)
    target, other = await make_account(c, 0)
    me = auth("bettor", owner)
    key = str(uuid.uuid4())
    ok = {"fromAccountId": source, "toAccountId": target, "amount": 60}
    url = "/api/transfers"
    return [
        await c.post(url, json=ok, headers=_key(me, key)),  # 201
        await c.post(url, json=ok, headers=_key(me, key)),  # 200 replay
        await c.post(url, json={**ok, "amount": 61}, headers=_key(me, key)),  # 422 reused
        await c.post(url, json=ok, headers=_key(me)),  # 409 insufficient_funds
        await c.post(url, json={**ok, "toAccountId": 2**62}, headers=_key(me)),  # 404
        await c.post(url, json={**ok, "toAccountId": source}, headers=_key(me)),  # 422 same_account
        await c.post(url, json=ok, headers=_key(auth("bettor", other))),  # 404 not theirs
        await c.post(url, json=ok, headers=_key(auth("patient", owner))),  # 403 role
        await c.post(url, json=ok, headers=me),  # 400 no key
        await c.post(url, json=ok, headers=_key(me, "a b")),  # 400 bad key
        await c.post(url, json=ok, headers=_key(auth("admin", 1))),  # 409 (40 left)
        await c.post(url, json={**ok, "amount": 40}, headers=_key(auth("admin", 1))),  # 201
    ]


async def s_jobs(c: httpx.AsyncClient) -> list[httpx.Response]:
    url, key = "/api/jobs", str(uuid.uuid4())
    hook = {"url": "https://callbacks.example.com/hook"}
    job = {"category": "http", "urgency": 3, "delayMs": 3_600_000, "payload": hook}
    return [
        await c.post(url, json=job, headers=_key(SERVICE, key)),  # 201
        await c.post(url, json=job, headers=_key(SERVICE, key)),  # 200 replay
        await c.post(url, json={**job, "urgency": 4}, headers=_key(SERVICE, key)),  # 422
        await c.post(url, json=job, headers=SERVICE),  # 201 without a key
        await c.post(url, json={**job, "category": "nope"}, headers=_key(SERVICE)),  # 422
        await c.post(  # 422 both runAt and delayMs
            url, json={**job, "runAt": "2030-01-01T00:00:00Z"}, headers=_key(SERVICE)
        ),
        await c.post(  # 422 a destination the policy refuses
            url, json={**job, "payload": {"url": "http://127.0.0.1/x"}}, headers=_key(SERVICE)
        ),
        await c.post(url, json=job, headers=_key(auth("bettor", new_id()))),  # 403
        await c.post(url, json=job, headers=_key(SERVICE, "a b")),  # 400 bad key
    ]


async def s_delegated(c: httpx.AsyncClient) -> list[httpx.Response]:
    """Outside the lean shape: FastAPI answers (401, 422)."""
    source, owner = await make_account(c, 10)
    me = _key(auth("bettor", owner))
    job = {"category": "http", "delayMs": 1000, "payload": {"url": "https://a.example.com/"}}
    return [
        await c.post("/api/transfers", json={"fromAccountId": source}, headers=me),
        await c.post(
            "/api/transfers",
            json={"fromAccountId": source, "toAccountId": source, "amount": "1"},
            headers=me,
        ),
        await c.post("/api/transfers", json={"fromAccountId": source, "toAccountId": 1}),
        await c.post("/api/jobs", json={**job, "urgency": 10}, headers=_key(SERVICE)),
        await c.post("/api/jobs", json={**job, "extra": 1}, headers=_key(SERVICE)),
        await c.post("/api/jobs", json=[job], headers=_key(SERVICE)),
        await c.post("/api/jobs", json=job, headers={"Idempotency-Key": "x"}),
    ]


CREATED, REPLAYED = (201, None), (200, None)
REUSED, KEY_REQUIRED = (422, "idempotency_key_reused"), (400, "idempotency_key_required")
NOT_FOUND, POOR = (404, "account_not_found"), (409, "insufficient_funds")
INVALID, UNAUTHENTICATED = (422, "validation_error"), (401, "unauthenticated")
# What each scenario answers, request by request: (status, problem code or None).
ANSWERS: dict[str, list[tuple[int, str | None]]] = {
    "transfers": [
        CREATED,
        REPLAYED,
        REUSED,
        POOR,
        NOT_FOUND,
        (422, "same_account"),
        NOT_FOUND,
        (403, "forbidden"),
        KEY_REQUIRED,
        KEY_REQUIRED,
        POOR,
        CREATED,
    ],
    "jobs": [
        CREATED,
        REPLAYED,
        REUSED,
        CREATED,
        (422, "unknown_category"),
        INVALID,
        (422, "destination_not_allowed"),
        (403, "forbidden"),
        KEY_REQUIRED,
    ],
    "delegated": [INVALID, INVALID, UNAUTHENTICATED, INVALID, INVALID, INVALID, UNAUTHENTICATED],
}
SCENARIOS: dict[str, tuple[Scenario, bool]] = {
    "transfers": (s_transfers, True),
    "jobs": (s_jobs, True),
    "delegated": (s_delegated, False),
}


@pytest.mark.parametrize("name", sorted(SCENARIOS))
async def test_lean_writes_answer_as_fastapi(base_settings: Settings, name: str) -> None:
    scenario, strict = SCENARIOS[name]
    async with _client(base_settings, lean=True, strict=strict) as c:
        lean = [_masked(r) for r in await scenario(c)]
    async with _client(base_settings, lean=False, strict=False) as c:
        plain = [_masked(r) for r in await scenario(c)]
    assert lean == plain
    assert [(s, body["code"] if s >= 400 else None) for s, body, _ in lean] == ANSWERS[name]
