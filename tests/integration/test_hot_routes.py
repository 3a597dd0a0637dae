"""The hot routes (core/http/hotroute.py) through HTTP: each is served by the handler
compiled from its own FastAPI declaration, reached by the request pipeline's
router (core/http/pipeline.py) after the same concerns as every route, for every
request of its method and path (401, 403, 422, 413, problems included), never
through FastAPI's own router."""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator
from datetime import date, timedelta
from typing import Annotated, Any

import asyncpg
import httpx
import pytest
from fastapi import Depends, FastAPI, Request
from starlette.types import Receive, Scope, Send

from reservo.app import create_app
from reservo.bootstrap import build
from reservo.core.http import pipeline
from reservo.core.http.hotroute import HotRouter, compile_route, hot_routes
from reservo.core.kernel import metrics
from reservo.core.kernel.clock import OffsetClock
from reservo.settings import Settings
from tests.helpers.appointments import make_slots
from tests.helpers.auth import ADMIN, auth, new_id
from tests.helpers.betting import make_account

SERVICE = auth("service", 1)


class Hot:
    """A client of the app, and the paths of the requests that went to
    FastAPI's own router instead of straight to a hot route's handler."""

    def __init__(self, client: httpx.AsyncClient, stacked: list[str]) -> None:
        self.c = client
        self.stacked = stacked


@pytest.fixture
async def hot(base_settings: Settings) -> AsyncIterator[Hot]:
    container = build(base_settings.model_copy(update={"lean_paths": True}), OffsetClock())
    app = create_app(container)
    layer: Any = app.pipeline  # type: ignore[attr-defined]
    while not isinstance(layer, HotRouter):  # each concern wraps the next as .app
        layer = layer.app
    stack, stacked = layer.app, []

    async def recording(scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http":
            stacked.append(scope["path"])
        await stack(scope, receive, send)

    layer.app = recording
    transport = httpx.ASGITransport(app=app)
    async with httpx.AsyncClient(transport=transport, base_url="http://reservo.test") as c:
        yield Hot(c, stacked)
    await container.close()


def code(r: httpx.Response) -> tuple[int, str | None]:
    return r.status_code, r.json().get("code") if r.status_code >= 400 else None


def fields(r: httpx.Response) -> list[tuple[str, ...]]:
    """The locations a 422 names."""
    return [tuple(e["loc"]) for e in r.json()["errors"]]


async def test_booking_validation_auth_and_problems_are_the_hot_handlers(hot: Hot) -> None:
    c = hot.c
    _, slots = await make_slots(c, capacity=1, days_ahead=3)
    hot.stacked.clear()
    patient = new_id()
    good = {**auth("patient", patient), "Idempotency-Key": f"k-{uuid.uuid4()}"}
    body = {"slotId": slots[0]["id"], "patientId": patient}
    url = "/api/appointments"
    assert code(await c.post(url, json=body)) == (401, "unauthenticated")
    bad_token = {"Authorization": "Bearer nope", "Idempotency-Key": "d"}
    assert code(await c.post(url, json=body, headers=bad_token)) == (401, "unauthenticated")
    # The role rule before the body: a service learns nothing of the fields.
    assert code(await c.post(url, json={}, headers=SERVICE)) == (403, "forbidden")
    for wrong, loc in [
        ({**body, "slotId": str(slots[0]["id"])}, ("body", "slotId")),
        ({**body, "slotId": True}, ("body", "slotId")),
        ({**body, "x": 1}, ("body", "x")),
        ({**body, "slotId": 0}, ("body", "slotId")),
        ({**body, "slotId": 2**63}, ("body", "slotId")),
        ([1, 2], ("body",)),
    ]:
        r = await c.post(url, json=wrong, headers=good)
        assert code(r) == (422, "validation_error"), wrong
        assert loc in fields(r), (wrong, r.json())
    nan = await c.post(
        url, content=b'{"slotId": NaN}', headers={**good, "Content-Type": "application/json"}
    )
    assert code(nan) == (422, "validation_error")
    assert nan.json()["detail"] == "the request body is not acceptable JSON"
    text = await c.post(url, content=b"not json", headers={**good, "Content-Type": "text/plain"})
    assert code(text) == (422, "validation_error") and fields(text) == [("body",)]
    empty = await c.post(url, headers=good)
    assert code(empty) == (422, "validation_error") and fields(empty) == [("body",)]
    # The key rule, then the booking, its replay and the refusals.
    assert code(await c.post(url, json=body, headers=auth("patient", patient))) == (
        400,
        "idempotency_key_required",
    )
    someone = {**auth("patient", new_id()), "Idempotency-Key": "x"}
    assert code(await c.post(url, json=body, headers=someone)) == (403, "forbidden")
    first = await c.post(url, json=body, headers=good)
    assert first.status_code == 201 and first.json()["slotId"] == slots[0]["id"]
    again = await c.post(url, json=body, headers=good)
    assert again.status_code == 200 and again.json() == first.json()
    other = {"slotId": slots[0]["id"], "patientId": new_id()}
    full = await c.post(
        url, json=other, headers={**auth("patient", other["patientId"]), "Idempotency-Key": "f"}
    )
    assert code(full) == (409, "slot_full")
    reused = {"slotId": slots[1]["id"], "patientId": patient}
    assert code(await c.post(url, json=reused, headers=good)) == (422, "idempotency_key_reused")
    assert hot.stacked == []


async def test_slot_list_and_search_validation_and_auth_are_the_hot_handlers(hot: Hot) -> None:
    c = hot.c
    doctor, slots = await make_slots(c, capacity=1, days_ahead=3)
    day = slots[0]["startAt"][:10]
    hot.stacked.clear()
    listed = await c.get(f"/api/doctors/{doctor}/slots", params={"date": day}, headers=ADMIN)
    assert listed.status_code == 200 and [s["id"] for s in listed.json()] == [
        s["id"] for s in slots
    ]
    assert code(await c.get(f"/api/doctors/{doctor}/slots", params={"date": day})) == (
        401,
        "unauthenticated",
    )
    for path, params, loc in [
        ("/api/doctors/0/slots", {"date": day}, ("path", "doctorId")),
        ("/api/doctors/x/slots", {"date": day}, ("path", "doctorId")),
        ("/api/doctors/1/slots", {"date": "2026-02-30"}, ("query", "date")),
        ("/api/doctors/1/slots", {"date": "1999-12-31"}, ("query", "date")),
        ("/api/doctors/1/slots", {}, ("query", "date")),
    ]:
        r = await c.get(path, params=params, headers=ADMIN)
        assert code(r) == (422, "validation_error"), (path, params)
        assert fields(r) == [loc], r.json()
    missing = await c.get("/api/doctors/4611686018427387904/slots", params={"date": day})
    assert missing.status_code == 401  # auth first
    missing = await c.get(
        "/api/doctors/4611686018427387904/slots", params={"date": day}, headers=ADMIN
    )
    assert code(missing) == (404, "doctor_not_found")

    who = auth("customer", new_id())
    start = date.today() + timedelta(days=10)
    period = {"from": f"{start}T08:00:00Z", "to": f"{start + timedelta(days=2)}T18:30:00Z"}
    city = f"hot-{uuid.uuid4().hex[:10]}"
    found = await c.get("/api/cars", params={"city": city, **period}, headers=who)
    assert found.status_code == 200 and found.json() == {"items": [], "next": None}
    assert code(await c.get("/api/cars", params={"city": city, **period})) == (
        401,
        "unauthenticated",
    )
    for params, loc in [
        ({"city": city, **period, "limit": "201"}, ("query", "limit")),
        ({"city": city, **period, "after": "not-a-cursor"}, ("query", "after")),
        ({"city": city, "from": period["from"]}, ("query", "to")),
        ({"city": city, **period, "to": "2026-02-30T00:00:00Z"}, ("query", "to")),
    ]:
        r = await c.get("/api/cars", params=params, headers=who)
        assert code(r) == (422, "validation_error"), params
        assert fields(r) == [loc], r.json()
    reversed_ = {"city": city, "from": period["to"], "to": period["from"]}
    assert code(await c.get("/api/cars", params=reversed_, headers=who))[0] == 422
    assert hot.stacked == []


async def test_jobs_and_transfers_validation_and_auth_are_the_hot_handlers(hot: Hot) -> None:
    c = hot.c
    job = {"category": "http", "urgency": 3, "payload": {"url": "http://x.test/"}}
    assert code(await c.post("/api/jobs", json=job)) == (401, "unauthenticated")
    assert code(await c.post("/api/jobs", json={}, headers=auth("patient", 1))) == (
        403,
        "forbidden",
    )
    r = await c.post("/api/jobs", json={**job, "urgency": "high"}, headers=SERVICE)
    assert code(r) == (422, "validation_error") and ("body", "urgency") in fields(r)
    both = {**job, "runAt": "2030-01-01T00:00:00Z", "delayMs": 5}
    assert code(await c.post("/api/jobs", json=both, headers=SERVICE)) == (422, "validation_error")
    created = await c.post("/api/jobs", json=job, headers=SERVICE)
    assert created.status_code == 201, created.text

    bettor = auth("bettor", new_id())
    move = {"fromAccountId": 1, "toAccountId": 2, "amount": 5}
    assert code(await c.post("/api/transfers", json=move)) == (401, "unauthenticated")
    assert code(await c.post("/api/transfers", json={}, headers=SERVICE)) == (403, "forbidden")
    r = await c.post("/api/transfers", json={**move, "amount": -1}, headers=bettor)
    assert code(r) == (422, "validation_error") and ("body", "amount") in fields(r)
    assert code(await c.post("/api/transfers", json=move, headers=bettor)) == (
        400,
        "idempotency_key_required",
    )
    assert hot.stacked == []


async def test_a_hot_body_over_the_limit_or_unsized_meets_the_body_limit(
    hot: Hot, base_settings: Settings
) -> None:
    c = hot.c
    good = {**auth("patient", new_id()), "Idempotency-Key": "big"}
    big = await c.post("/api/appointments", content=b"x" * 2_000_000, headers=good)
    assert code(big) == (413, "payload_too_large")

    async def chunks() -> AsyncIterator[bytes]:
        yield b'{"slotId": 1, '
        yield b'"patientId": "x"}'

    chunked = await c.post(
        "/api/appointments",
        content=chunks(),
        headers={**good, "Content-Type": "application/json"},
    )
    # Unsized, to the same handler: its 422, not FastAPI's own.
    assert code(chunked) == (422, "validation_error")
    assert ("body", "patientId") in fields(chunked)
    # Unsized and past the limit, cut off while the intake reads it (JSON) or
    # while the hot handler reads it (any other type): the limit's 413 either way.
    piece = b"x" * (base_settings.max_body_bytes // 3 + 1)

    async def too_much() -> AsyncIterator[bytes]:
        for _ in range(4):
            yield piece

    for media in ("application/json", "text/plain"):
        cut = await c.post(
            "/api/appointments", content=too_much(), headers={**good, "Content-Type": media}
        )
        assert code(cut) == (413, "payload_too_large"), media
    assert hot.stacked == []


async def test_hot_answers_are_counted_under_the_route_template(hot: Hot) -> None:
    def count(status: str) -> float:
        child = metrics.HTTP_REQUESTS.labels("POST", "/api/appointments", status)
        return float(child._value.get())

    before = count("401")
    await hot.c.post("/api/appointments", json={})
    assert count("401") == before + 1


async def test_an_unexpected_error_on_a_hot_route_is_the_apps_500_and_is_counted() -> None:
    app = FastAPI()

    @app.get("/boom/{id}")
    async def boom(id: int) -> None:
        raise RuntimeError("a bug")

    served = pipeline.build(
        app, hot_routes(app, [boom]), max_body_bytes=1000, deadlines=None, access_log=None
    )
    counted = metrics.HTTP_REQUESTS.labels("GET", "/boom/{id}", "500")._value.get()
    transport = httpx.ASGITransport(app=served, raise_app_exceptions=False)
    async with httpx.AsyncClient(transport=transport, base_url="http://t") as c:
        r = await c.get("/boom/1")
    assert r.status_code == 500
    assert r.headers["content-type"] == "application/problem+json"
    assert r.json()["code"] == "internal_error"
    assert metrics.HTTP_REQUESTS.labels("GET", "/boom/{id}", "500")._value.get() == counted + 1


def _not_a_caller(request: Request) -> int:
    return 1


async def test_a_hot_route_must_be_a_route_of_the_app_in_the_supported_shape() -> None:
    app = FastAPI()

    async def nowhere() -> None:
        return None

    with pytest.raises(ValueError, match="without a route of the app"):
        hot_routes(app, [nowhere])

    @app.get("/other")
    async def uses_other(n: Annotated[int, Depends(_not_a_caller)]) -> Any:
        return n

    route = next(r for r in app.routes if getattr(r, "endpoint", None) is uses_other)
    with pytest.raises(ValueError, match="only the caller dependencies"):
        compile_route(route)

    @app.get("/sync")
    def sync_route() -> Any:
        return 1

    route = next(r for r in app.routes if getattr(r, "endpoint", None) is sync_route)
    with pytest.raises(ValueError, match="must be async"):
        compile_route(route)


@pytest.mark.parametrize("front", [True, False], ids=["front", "stack"])
async def test_one_rule_stores_refusals_for_a_key_on_every_path(
    base_settings: Settings, db: asyncpg.Connection, front: bool
) -> None:
    """core.http.idempotency.is_stored: a request's own refusal (409) is stored for
    its key and replayed; who may not act (403) is not, its claim is dropped.
    The transfer batch stored its 403s; the booking's run_idempotent did not."""
    container = build(base_settings.model_copy(update={"lean_paths": front}), OffsetClock())
    transport = httpx.ASGITransport(app=create_app(container))
    async with httpx.AsyncClient(transport=transport, base_url="http://reservo.test") as c:
        account, owner = await make_account(c, 100)
        other, _ = await make_account(c, 0)
        world = await db.fetchval(
            "SELECT id FROM wallet_account WHERE currency = 'EUR' AND kind = 'WORLD'"
        )
        bettor = auth("bettor", owner)
        k403, k409 = f"w403-{uuid.uuid4()}", f"w409-{uuid.uuid4()}"
        moves = [
            ({"fromAccountId": account, "toAccountId": world, "amount": 5}, k403, 403),
            ({"fromAccountId": account, "toAccountId": other, "amount": 10_000}, k409, 409),
        ]
        for move, key, status in moves:
            headers = {**bettor, "Idempotency-Key": key}
            r = await c.post("/api/transfers", json=move, headers=headers)
            assert r.status_code == status, r.text

        # The booking's run_idempotent: already_booked is decided after the claim.
        _, slots = await make_slots(c, capacity=2, days_ahead=3)
        patient = new_id()
        booking = {"slotId": slots[0]["id"], "patientId": patient}
        b201, b409 = f"b201-{uuid.uuid4()}", f"b409-{uuid.uuid4()}"
        for key, status in ((b201, 201), (b409, 409)):
            r = await c.post(
                "/api/appointments",
                json=booking,
                headers={**auth("patient", patient), "Idempotency-Key": key},
            )
            assert r.status_code == status, r.text
    await container.close()
    rows = await db.fetch(
        "SELECT key, status, response_status FROM idempotency_key WHERE key = ANY($1)",
        [k403, k409, b201, b409],
    )
    assert {r["key"]: (r["status"], r["response_status"]) for r in rows} == {
        k409: ("DONE", 409),
        b201: ("DONE", 201),
        b409: ("DONE", 409),
    }


async def test_a_hot_body_is_walked_once_and_a_stacked_one_as_before(
    hot: Hot, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The intake walk (core.http.schemas._walk) of a hot route's body is made by
    read_json alone: the model's own walk of the same document is skipped
    (the WALKED context), where it used to be made twice."""
    from reservo.core.http import schemas

    job = {"category": "http", "urgency": 3, "payload": {"url": "http://x.test/"}}
    walks: list[int] = []
    walk = schemas._walk

    def counted(value: Any) -> tuple[str | None, int]:
        if value == job:  # the body itself (the payload and the answer are walked too)
            walks.append(1)
        return walk(value)

    monkeypatch.setattr(schemas, "_walk", counted)
    created = await hot.c.post("/api/jobs", json=job, headers=SERVICE)
    assert created.status_code == 201, created.text
    assert hot.stacked == [] and len(walks) == 1
    # A NUL is refused either way: read_json's rule, before the model.
    nul = await hot.c.post("/api/jobs", json={**job, "payload": {"x": "a\x00"}}, headers=SERVICE)
    assert code(nul) == (422, "validation_error")


def test_the_walked_context_skips_only_the_object_read_json_walked() -> None:
    from pydantic import ValidationError

    from reservo.appointments.schemas import AppointmentIn
    from reservo.core.http.schemas import WALKED

    bad = {"slotId": 1, "patientId": 2, "x\x00": 1}
    with pytest.raises(ValidationError, match="NUL"):
        AppointmentIn.model_validate(bad, context={WALKED: dict(bad)})
    with pytest.raises(ValidationError, match="NUL"):
        AppointmentIn.model_validate(bad)


@pytest.mark.parametrize("lean", [True, False], ids=["compiled", "fastapi"])
async def test_repeated_headers_read_as_fastapi_reads_them(
    base_settings: Settings, lean: bool
) -> None:
    """The compiled route reads headers from the scope's list (the first of a
    repeated name, as Starlette's Headers.get): the same answers as FastAPI's
    own route, which the `fastapi` case runs."""
    container = build(base_settings.model_copy(update={"lean_paths": lean}), OffsetClock())
    app = create_app(container)
    transport = httpx.ASGITransport(app=app)
    try:
        async with httpx.AsyncClient(transport=transport, base_url="http://reservo.test") as c:
            job = {"category": "http", "urgency": 3, "payload": {"url": "http://x.test/"}}
            token = SERVICE["Authorization"]
            answers = []
            for headers in (
                [("Authorization", token), ("Authorization", "Bearer nope")],
                [("Authorization", "Bearer nope"), ("Authorization", token)],
                [("authorization", token), ("Idempotency-Key", "a b"), ("Idempotency-Key", "ok")],
                [("AUTHORIZATION", token), ("idempotency-key", f"k-{uuid.uuid4()}")],
            ):
                r = await c.post("/api/jobs", json=job, headers=headers)
                answers.append(code(r))
            assert answers == [
                (201, None),
                (401, "unauthenticated"),
                (400, "idempotency_key_required"),  # the two keys are joined first
                (201, None),
            ]
    finally:
        await container.close()
