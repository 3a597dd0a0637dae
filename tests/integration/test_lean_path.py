"""The lean path (core/lean.py) answers exactly as the FastAPI routes it stands in
for: each scenario runs against an app with the lean path and one without
(RESERVO_LEAN_PATHS=false), on fresh slots of their own, and the answers must
match in status, body (ids aside) and headers.

In the lean app FastAPI's own authentication is replaced by one that fails the
test, so a request the lean path was meant to take cannot quietly have gone to
FastAPI instead."""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from datetime import date, timedelta
from typing import Annotated, Any

import httpx
import pytest
from fastapi import FastAPI, Header, Request

from reservo.app import create_app
from reservo.bootstrap import build
from reservo.core.auth import Principal
from reservo.core.clock import OffsetClock
from reservo.core.http import current_principal
from reservo.core.lean import LeanLayer
from reservo.settings import Settings
from tests.helpers.appointments import make_slots
from tests.helpers.auth import ADMIN, auth, new_id
from tests.helpers.lean import shape

Scenario = Callable[[httpx.AsyncClient], Awaitable[list[httpx.Response]]]


async def _not_for_lean_routes(
    request: Request, authorization: Annotated[str | None, Header()] = None
) -> Principal:
    """FastAPI's authentication, except on the routes the lean path serves."""
    lean = (
        (request.method, request.url.path) == ("POST", "/api/appointments")
        or (request.method == "GET" and request.url.path.endswith("/slots"))
        or (request.method, request.url.path) == ("GET", "/api/cars")
    )
    if lean:
        raise AssertionError("the lean path should have answered this request")
    return await current_principal(request, authorization)


@asynccontextmanager
async def _app(settings: Settings, *, lean: bool, strict: bool) -> AsyncIterator[httpx.AsyncClient]:
    container = build(settings.model_copy(update={"lean_paths": lean}), OffsetClock())
    app = create_app(container)
    if strict:
        app.dependency_overrides[current_principal] = _not_for_lean_routes
    try:
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://reservo.test") as c:
            yield c
    finally:
        await container.close()


async def _fresh(client: httpx.AsyncClient, capacity: int = 1) -> tuple[int, str, list[int]]:
    doctor, slots = await make_slots(client, capacity=capacity, days_ahead=3)
    return doctor, slots[0]["startAt"][:10], [s["id"] for s in slots]


def _book(slot: int, patient: int, key: str | None = "fresh", **extra: Any) -> dict[str, Any]:
    headers = dict(auth("patient", patient))
    if key is not None:
        headers["Idempotency-Key"] = str(uuid.uuid4()) if key == "fresh" else key
    return {
        "url": "/api/appointments",
        "json": {"slotId": slot, "patientId": patient},
        "headers": headers,
        **extra,
    }


async def s_list(c: httpx.AsyncClient) -> list[httpx.Response]:
    doctor, day, _ = await _fresh(c)
    url = f"/api/doctors/{doctor}/slots"
    patient = auth("patient", new_id())
    empty = (date.today() + timedelta(days=40)).isoformat()
    return [
        await c.get(url, params={"date": day}, headers=patient),
        await c.get(url, params={"date": day}, headers=ADMIN),  # cached now
        await c.get(url, params={"date": empty}, headers=patient),
        await c.get("/api/doctors/4611686018427387904/slots", params={"date": day}, headers=ADMIN),
    ]


async def s_book_and_refusals(c: httpx.AsyncClient) -> list[httpx.Response]:
    _, _, slots = await _fresh(c)
    first, second, other = new_id(), new_id(), new_id()
    key = f"k-{uuid.uuid4()}"
    out = [await c.post(**_book(slots[0], first, key))]  # 201
    out.append(await c.post(**_book(slots[0], first, key)))  # replayed 200
    out.append(await c.post(**_book(slots[0], second)))  # 409 slot_full (database, then mark)
    out.append(await c.post(**_book(slots[0], second)))  # 409 slot_full (Redis gate)
    out.append(await c.post(**_book(slots[1], first)))  # 201, another slot
    out.append(await c.post(**_book(slots[1], first)))  # 409 slot_full (Redis gate, first)
    out.append(await c.post(**_book(4611686018427387904, other)))  # 404 slot_not_found
    out.append(  # 422 the same key with another body
        await c.post(
            "/api/appointments",
            json={"slotId": slots[2], "patientId": first},
            headers={**auth("patient", first), "Idempotency-Key": key},
        )
    )
    return out


async def s_forbidden_and_key(c: httpx.AsyncClient) -> list[httpx.Response]:
    _, _, slots = await _fresh(c)
    patient = new_id()
    someone = {**auth("patient", new_id()), "Idempotency-Key": "x"}
    return [
        # 403: booking for another patient
        await c.post(
            "/api/appointments", json={"slotId": slots[0], "patientId": patient}, headers=someone
        ),
        # 201: an admin may book for anyone
        await c.post(
            "/api/appointments",
            json={"slotId": slots[0], "patientId": patient},
            headers={**ADMIN, "Idempotency-Key": str(uuid.uuid4())},
        ),
        # 400: no key, empty key, a key with a space
        await c.post(**_book(slots[0], patient, None)),
        await c.post(**_book(slots[0], patient, "")),
        await c.post(**_book(slots[0], patient, "a b")),
    ]


async def s_rate_limited(c: httpx.AsyncClient) -> list[httpx.Response]:
    _, _, slots = await _fresh(c, capacity=100)
    patient = new_id()
    out = []
    for i in range(7):  # 5 per 10 s: the 6th and 7th are 429 with Retry-After
        out.append(await c.post(**_book(slots[i % len(slots)], patient)))
    return out


async def _search_city(c: httpx.AsyncClient) -> tuple[str, str, str]:
    """A city of 3 new cars, and a lean-shaped period (UTC, "Z") 10 days ahead."""
    city = f"lean-{uuid.uuid4().hex[:10]}"
    for i in range(3):
        car = {
            "plate": f"L-{uuid.uuid4().hex[:10]}",
            "model": "Fiat Uno",
            "city": city,
            "dailyPrice": 10_000 + i,
            "hostId": new_id(),
        }
        r = await c.post("/api/cars", json=car, headers={**ADMIN, "Idempotency-Key": city + str(i)})
        assert r.status_code == 201, r.text
    start = date.today() + timedelta(days=10)
    return city, f"{start}T08:00:00Z", f"{start + timedelta(days=2)}T18:30:00Z"


async def s_search(c: httpx.AsyncClient) -> list[httpx.Response]:
    city, start, end = await _search_city(c)
    who = auth("customer", new_id())
    url = f"/api/cars?city={city}&from={start}&to={end}"
    return [
        await c.get(url, headers=who),
        await c.get(url, headers=ADMIN),  # cached now
        await c.get(url + "&limit=2", headers=who),
        await c.get(f"/api/cars?city={city}&from={end}&to={start}", headers=who),  # 422
        await c.get(f"/api/cars?city=nowhere-{city}&from={start}&to={end}", headers=who),
    ]


STRICT: dict[str, Scenario] = {
    "list": s_list,
    "book": s_book_and_refusals,
    "forbidden-and-key": s_forbidden_and_key,
    "rate-limited": s_rate_limited,
    "search": s_search,
}
SLOT_FULL, ALREADY_BOOKED = (409, "slot_full"), (409, "already_booked")
VALIDATION, UNAUTHENTICATED = (422, "validation_error"), (401, "unauthenticated")
# What each scenario answers, request by request: (status, problem code or None).
ANSWERS: dict[str, list[tuple[int, str | None]]] = {
    "list": [(200, None), (200, None), (200, None), (404, "doctor_not_found")],
    "book": [
        (201, None),
        (200, None),
        SLOT_FULL,
        SLOT_FULL,
        (201, None),
        SLOT_FULL,  # the slot has one seat, the patient's: Redis says full before the database
        (404, "slot_not_found"),
        (422, "idempotency_key_reused"),
    ],
    "forbidden-and-key": [(403, "forbidden"), (201, None)]
    + [(400, "idempotency_key_required")] * 3,
    "rate-limited": [(201, None)] * 4 + [ALREADY_BOOKED] + [(429, "rate_limited")] * 2,
    "search": [(200, None)] * 3 + [VALIDATION, (200, None)],
}


def answers(shapes: list[tuple[int, Any, dict[str, str]]]) -> list[tuple[int, str | None]]:
    return [(s, body["code"] if s >= 400 else None) for s, body, _ in shapes]


async def s_delegated(c: httpx.AsyncClient) -> list[httpx.Response]:
    """Requests outside the lean shape: FastAPI answers them (401, 422, 413...)."""
    _, day, slots = await _fresh(c)
    patient = new_id()
    good = {**auth("patient", patient), "Idempotency-Key": "d"}
    url = "/api/appointments"
    return [
        await c.post(url, json={"slotId": slots[0], "patientId": patient}),  # 401
        await c.post(
            url,
            json={"slotId": slots[0], "patientId": patient},
            headers={"Authorization": "Bearer nope", "Idempotency-Key": "d"},
        ),
        await c.post(
            url, json={"slotId": str(slots[0]), "patientId": patient}, headers=good
        ),  # 422
        await c.post(url, json={"slotId": True, "patientId": patient}, headers=good),
        await c.post(url, json={"slotId": slots[0], "patientId": patient, "x": 1}, headers=good),
        await c.post(url, json={"slot_id": slots[0], "patient_id": patient}, headers=good),
        await c.post(url, json={"slotId": 0, "patientId": patient}, headers=good),
        await c.post(url, json={"slotId": 2**63, "patientId": patient}, headers=good),
        await c.post(url, json=[1, 2], headers=good),
        await c.post(
            url, content=b'{"slotId": NaN}', headers={**good, "Content-Type": "application/json"}
        ),
        await c.post(url, content=b"not json", headers={**good, "Content-Type": "text/plain"}),
        await c.post(url, content=b"x" * 2_000_000, headers=good),  # 413
        await c.get("/api/doctors/0/slots", params={"date": day}, headers=ADMIN),  # 422
        await c.get("/api/doctors/007/slots", params={"date": day}, headers=ADMIN),
        await c.get("/api/doctors/1/slots", params={"date": "1999-12-31"}, headers=ADMIN),
        await c.get("/api/doctors/1/slots", params={"date": "2026-02-30"}, headers=ADMIN),
        await c.get("/api/doctors/1/slots", headers=ADMIN),
        await c.get("/api/doctors/1/slots", params={"date": day}),  # 401
        *await _search_delegated(c),
    ]


async def _search_delegated(c: httpx.AsyncClient) -> list[httpx.Response]:
    city, start, end = await _search_city(c)
    who = auth("customer", new_id())
    return [
        await c.get(f"/api/cars?city={city}&from={start}&to={end}"),  # 401
        await c.get(f"/api/cars?city={city}&from={start}&to={end}&limit=501", headers=who),
        await c.get(f"/api/cars?city={city}&from={start}&to=2100-01-01T00:00:00Z", headers=who),
        await c.get(f"/api/cars?city={city}&from={start}&to=2026-02-30T00:00:00Z", headers=who),
        await c.get(f"/api/cars?city={city}&from={start}", headers=who),  # 422
        await c.get(f"/api/cars?to={end}&from={start}&city={city}", headers=who),  # 200
        await c.get(
            "/api/cars",
            params={"city": city, "from": start.replace("Z", "+02:00"), "to": end},
            headers=who,
        ),
    ]


@pytest.mark.parametrize("name", sorted(STRICT))
async def test_the_lean_path_answers_as_fastapi(base_settings: Settings, name: str) -> None:
    scenario = STRICT[name]
    async with _app(base_settings, lean=True, strict=True) as c:
        lean = [shape(r) for r in await scenario(c)]
    async with _app(base_settings, lean=False, strict=False) as c:
        plain = [shape(r) for r in await scenario(c)]
    assert lean == plain
    assert answers(lean) == ANSWERS[name]
    if name == "rate-limited":
        assert all("retry-after" in h for _, _, h in lean[5:])


async def test_requests_outside_the_lean_shape_get_fastapis_answer(
    base_settings: Settings,
) -> None:
    async with _app(base_settings, lean=True, strict=False) as c:
        lean = [shape(r) for r in await s_delegated(c)]
    async with _app(base_settings, lean=False, strict=False) as c:
        plain = [shape(r) for r in await s_delegated(c)]
    assert lean == plain
    assert answers(lean) == [
        UNAUTHENTICATED,
        UNAUTHENTICATED,
        *[VALIDATION] * 3,
        (201, None),
        *[VALIDATION] * 5,
        (413, "payload_too_large"),
        VALIDATION,
        (200, None),
        *[VALIDATION] * 3,
        UNAUTHENTICATED,
        UNAUTHENTICATED,
        *[VALIDATION] * 4,
        (200, None),
        (200, None),
    ]


async def test_a_lean_route_must_stand_for_a_fastapi_route() -> None:
    async def handler(_: Any) -> None:
        return None

    from reservo.core.lean import LeanRoute

    with pytest.raises(ValueError, match="has no FastAPI route"):
        LeanLayer(FastAPI(), [LeanRoute("GET", "/nowhere/{id}", handler)], FastAPI(), 1000)


async def test_an_unexpected_error_on_the_lean_path_is_the_apps_500_and_is_counted() -> None:
    from reservo.core import metrics
    from reservo.core.clock import SystemClock
    from reservo.core.lean import LeanRoute

    app = FastAPI()

    @app.get("/boom/{id}")
    async def boom(id: int) -> None:  # the route the lean one stands for
        raise AssertionError("the lean path should have answered")

    async def handler(_: Any) -> None:
        raise RuntimeError("a bug")

    app.state.clock, app.state.tokens = SystemClock(), None
    layer = LeanLayer(app, [LeanRoute("GET", "/boom/{id}", handler)], app, 1000)
    counted = metrics.HTTP_REQUESTS.labels("GET", "unmatched", "500")._value.get()
    transport = httpx.ASGITransport(app=layer, raise_app_exceptions=False)
    async with httpx.AsyncClient(transport=transport, base_url="http://t") as c:
        r = await c.get("/boom/1")
    assert r.status_code == 500
    assert r.headers["content-type"] == "application/problem+json"
    assert r.json()["code"] == "internal_error"
    assert metrics.HTTP_REQUESTS.labels("GET", "unmatched", "500")._value.get() == counted + 1
