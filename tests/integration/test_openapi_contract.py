"""The OpenAPI document as a client generator reads it: bearer security on the
protected operations only, one Problem schema behind every error, each
operation's own statuses and codes, required Idempotency-Keys, readable unique
names, docs served without a CDN, problem types that resolve. (That every
problem a test meets is declared for its operation is checked on every
response of the `client` fixture: tests/helpers/openapi_audit.py.)"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import httpx
import pytest
from fastapi.routing import APIRoute, iter_route_contexts

from reservo.app import create_app, openapi_document, openapi_text
from reservo.bootstrap import Container
from reservo.core.http.callers import current_principal
from tests.helpers.auth import auth, new_id
from tests.helpers.openapi_audit import PROBLEM_JSON, declared

REPO = Path(__file__).resolve().parents[2]
CHECKED_IN = REPO / "docs" / "openapi.json"
METHODS = ("get", "put", "post", "delete", "patch")


async def _doc(client: httpx.AsyncClient) -> dict[str, Any]:
    r = await client.get("/openapi.json")
    assert r.status_code == 200
    doc: dict[str, Any] = r.json()
    return doc


def _operations(doc: dict[str, Any]) -> list[tuple[str, str, dict[str, Any]]]:
    return [
        (method, path, op)
        for path, ops in doc["paths"].items()
        for method, op in ops.items()
        if method in METHODS
    ]


async def test_the_checked_in_document_is_the_served_one(client: httpx.AsyncClient) -> None:
    served = openapi_text(await _doc(client))
    assert openapi_text(openapi_document()) == served  # independent of the deployment
    assert CHECKED_IN.read_text(encoding="utf-8") == served, (
        "docs/openapi.json differs from the document the code serves: regenerate it with "
        "`reservo openapi -o docs/openapi.json` (or scripts/openapi.sh) and commit the diff"
    )


async def test_bearer_security_on_protected_operations_only(
    client: httpx.AsyncClient, container: Container
) -> None:
    doc = await _doc(client)
    assert doc["components"]["securitySchemes"]["bearerAuth"] == {
        "type": "http",
        "scheme": "bearer",
        "bearerFormat": "JWT",
    }
    app = create_app(container, owns_container=False)
    protected = set()
    for ctx in iter_route_contexts(list(app.routes)):
        if isinstance(ctx.original_route, APIRoute) and ctx.include_in_schema:
            stack, calls = [ctx.dependant], []
            while stack:
                dep = stack.pop()
                calls.append(dep.call)
                stack.extend(dep.dependencies)
            if current_principal in calls:
                protected |= {(m.lower(), str(ctx.path_format)) for m in ctx.methods or ()}
    assert len(protected) > 40
    for method, path, op in _operations(doc):
        names = {p["name"].lower() for p in op.get("parameters", [])}
        assert "authorization" not in names, (method, path)
        if (method, path) in protected:
            assert op.get("security") == [{"bearerAuth": []}], (method, path)
            assert "unauthenticated" in declared(op, 401), (method, path)
    public = {(m, p) for m, p, _ in _operations(doc)} - protected
    signed = {("post", "/api/payments/webhook"), ("post", "/api/webhooks/match-results")}
    ops = {(m, p): op for m, p, op in _operations(doc)}
    for key in public:
        # Said outright: the signed webhooks prove their sender by X-Signature, the rest are open.
        expected = [{"webhookSignature": []}] if key in signed else []
        assert ops[key]["security"] == expected, key
    assert doc["components"]["securitySchemes"]["webhookSignature"]["name"] == "X-Signature"
    assert public == signed | {
        ("get", "/healthz"),
        ("get", "/livez"),
        ("get", "/readyz"),
        ("get", "/metrics"),
        # A calendar application fetches a feed with no token: its URL is the secret.
        ("get", "/calendars/{token}.ics"),
    }
    # The public operations answer a request without a token.
    assert (await client.get("/healthz")).status_code == 200


async def test_every_error_response_is_the_problem_schema_with_its_codes(
    client: httpx.AsyncClient,
) -> None:
    doc = await _doc(client)
    problem = doc["components"]["schemas"]["Problem"]
    assert set(problem["properties"]) == {
        "type",
        "title",
        "status",
        "detail",
        "instance",
        "code",
        "errors",
    }
    assert "HTTPValidationError" not in doc["components"]["schemas"]
    examples = doc["components"]["examples"]
    for method, path, op in _operations(doc):
        for status, response in op["responses"].items():
            if int(status) < 400:
                continue
            media = response["content"][PROBLEM_JSON]
            assert media["schema"] == {"$ref": "#/components/schemas/Problem"}
            codes = declared(op, int(status))
            assert codes, (method, path, status)
            for code in codes:
                assert examples[code]["value"]["status"] == int(status), (code, status)
            has_retry = bool(codes & {"rate_limited", "unavailable", "request_in_progress"})
            assert ("Retry-After" in response.get("headers", {})) == has_retry
    # Each operation lists its own codes, not one list for all.
    ops = {op["operationId"]: op for _, _, op in _operations(doc)}
    assert declared(ops["bookAppointment"], 409) >= {"slot_full", "patient_busy", "slot_not_open"}
    assert "rate_limited" in declared(ops["bookAppointment"], 429)
    assert "Retry-After" in ops["bookAppointment"]["responses"]["429"]["headers"]
    assert declared(ops["getAppointment"], 404) == {"appointment_not_found"}
    assert "409" not in ops["getAppointment"]["responses"]
    assert "409" not in ops["listMatches"]["responses"]
    assert declared(ops["createTransfer"], 409) >= {"insufficient_funds", "currency_mismatch"}
    assert "slot_full" not in declared(ops["createTransfer"], 409)
    assert declared(ops["receivePayment"], 401) == {"bad_signature"}


async def test_idempotency_key_is_required_exactly_where_a_request_without_it_is_refused(
    client: httpx.AsyncClient,
) -> None:
    doc = await _doc(client)
    required = {}
    for method, path, op in _operations(doc):
        for param in op.get("parameters", []):
            if param["name"] == "Idempotency-Key" and param["required"]:
                required[op["operationId"]] = (method, path)
    # A body that parses, for each: the key is checked before anything is looked up.
    bodies: dict[str, tuple[str, dict[str, Any]]] = {
        "bookAppointment": ("/api/appointments", {"slotId": 1, "patientId": 1}),
        "rescheduleAppointment": ("/api/appointments/1/reschedule", {"slotId": 1}),
        "bookAppointmentSeries": ("/api/appointment-series", {"patientId": 1, "slotIds": [1]}),
        "holdCar": (
            "/api/bookings",
            {
                "carId": 1,
                "customerId": 1,
                "from": "2031-01-01T10:00:00Z",
                "to": "2031-01-02T10:00:00Z",
            },
        ),
        "depositToAccount": ("/api/accounts/1/deposits", {"amount": 100, "reference": "r-1"}),
        "createTransfer": ("/api/transfers", {"fromAccountId": 1, "toAccountId": 2, "amount": 1}),
        "placeBet": (
            "/api/bets",
            {
                "accountId": 1,
                "stake": 100,
                "selections": [{"matchId": 1, "market": "1X2", "pick": "HOME", "odds": "1.50"}],
            },
        ),
    }
    assert set(required) == set(bodies)
    for op_id, (url, body) in bodies.items():
        r = await client.post(url, json=body, headers=auth("admin", 1))
        assert r.status_code == 400, (op_id, r.text)
        assert r.json()["code"] == "idempotency_key_required"
        key = next(
            p
            for p in doc["paths"][required[op_id][1]]["post"]["parameters"]
            if p["name"] == "Idempotency-Key"
        )
        assert key["schema"] == {"type": "string", "pattern": "^[\\x21-\\x7e]{1,255}$"}


async def test_names_a_generator_keeps(client: httpx.AsyncClient) -> None:
    doc = await _doc(client)
    ids = [op["operationId"] for _, _, op in _operations(doc)]
    assert len(ids) == len(set(ids))
    for op_id in ids:
        assert re.fullmatch(r"[a-z]+(?:[A-Z][a-z]+)*", op_id), op_id
    assert {"bookAppointment", "listDoctorSlots", "rescheduleJob", "holdCar"} <= set(ids)
    # Unique model names: no module-qualified ones (FastAPI's answer to a clash).
    assert not [name for name in doc["components"]["schemas"] if "__" in name]
    # One name per path parameter: the segment before it decides it, on every route.
    names: dict[str, set[str]] = {}
    for path in doc["paths"]:
        for before, param in re.findall(r"([^/]+)/\{([^}]+)\}", path):
            names.setdefault(before, set()).add(param)
    assert all(len(v) == 1 for v in names.values()), names
    assert "{id}" not in " ".join(doc["paths"])
    assert names["doctors"] == {"doctorId"} and names["appointments"] == {"appointmentId"}


async def test_docs_and_redoc_are_served_by_the_process_and_not_framed(
    client: httpx.AsyncClient,
) -> None:
    pytest.importorskip("fastapi_offline", reason="the fastapi-offline dependency")
    for page in ("/docs", "/redoc"):
        r = await client.get(page)
        assert r.status_code == 200
        assert r.headers["content-type"].startswith("text/html")
        assert r.headers["x-frame-options"] == "DENY"
        assert "frame-ancestors 'none'" in r.headers["content-security-policy"]
        # Nothing is loaded from another host: every src/href is this server's.
        assert not re.search(r"(src|href|url)\s*[=:(]\s*['\"]?(https?:)?//", r.text), r.text
        for asset in re.findall(r"['\"](/docs/assets/[^'\"]+)['\"]", r.text):
            loaded = await client.get(asset)
            assert loaded.status_code == 200 and len(loaded.content) > 1000, asset


async def test_a_problem_type_resolves_and_its_title_names_the_problem(
    client: httpx.AsyncClient,
) -> None:
    patient = new_id()
    slot = new_id()
    headers = {**auth("patient", patient), "Idempotency-Key": f"k-{slot}"}
    # The booking's problem, with and without an extra field (once a different
    # implementation's answer): the same problem either way.
    lean = await client.post(
        "/api/appointments", json={"slotId": slot, "patientId": patient}, headers=headers
    )
    headers["Idempotency-Key"] = f"k2-{slot}"
    full = await client.post(
        "/api/appointments",
        content=f'{{"patientId": {patient}, "slotId": {slot}}}',
        headers={**headers, "content-type": "application/json;charset=utf-8"},
    )
    for r in (lean, full):
        assert r.status_code == 404
        body = r.json()
        assert body["code"] == "slot_not_found"
        assert body["title"] == "Slot not found"
        assert body["type"] == "/problems/slot_not_found"
    page = await client.get(lean.json()["type"])  # relative: resolves against the API
    assert page.status_code == 200 and page.headers["content-type"].startswith("text/html")
    assert "Slot not found" in page.text and "bookAppointment" in page.text
    missing = await client.get("/problems/no_such_problem")
    assert missing.status_code == 404 and missing.json()["code"] == "not_found"
    unauthenticated = await client.get("/api/appointments/1")
    assert unauthenticated.json()["title"] == "Unauthenticated"
