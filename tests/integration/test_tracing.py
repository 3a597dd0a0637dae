"""Traces and request ids end to end (core/kernel/tracing.py), through HTTP: the
request id accepted or made and echoed (on the hot path and FastAPI's), a bad
one replaced (never refused); the trace of a booking followed by an in-memory span exporter from
its POST through the outbox and the consumer to its confirmation notification;
the request id on the log lines of the request and of the consumer's work."""

from __future__ import annotations

import io
import logging
import re
import sys
import threading
import uuid
from collections.abc import AsyncIterator, Callable, Iterator
from typing import Any

import asyncpg
import httpx
import orjson
import pytest
import structlog

from reservo.app import create_app
from reservo.bootstrap import Container, build
from reservo.core.kernel import tracing
from reservo.core.kernel.access_log import AccessLog
from reservo.core.kernel.clock import OffsetClock
from reservo.core.kernel.logging import configure
from reservo.core_modules import Outbox
from reservo.settings import Settings
from tests.helpers.appointments import make_slots
from tests.helpers.auth import ADMIN, auth, new_id
from tests.helpers.waiting import drain

TRACE_ID = "4bf92f3577b34da6a3ce929d0e0e4736"
PARENT = f"00-{TRACE_ID}-00f067aa0ba902b7-01"
HEX32 = re.compile(r"[0-9a-f]{32}")


# ------------------------------------------------------------------ request ids


async def test_request_id_is_echoed_on_the_hot_path_and_fastapis(
    client: httpx.AsyncClient,
) -> None:
    _, slots = await make_slots(client)
    given = f"req-{uuid.uuid4()}"
    # The hot path's hottest route (a booking) and FastAPI's routes.
    patient = new_id()
    r = await client.post(
        "/api/appointments",
        json={"slotId": slots[0]["id"], "patientId": patient},
        headers={
            **auth("patient", patient),
            "Idempotency-Key": str(uuid.uuid4()),
            "X-Request-ID": "abc.DEF_1:2+3/4=5@6-7",
        },
    )
    assert r.status_code == 201 and r.headers["x-request-id"] == "abc.DEF_1:2+3/4=5@6-7"
    r = await client.get("/healthz", headers={"X-Request-ID": given})
    assert r.headers["x-request-id"] == given
    # An error answer echoes it too.
    r = await client.get("/api/appointments/999999999", headers={**ADMIN, "X-Request-ID": given})
    assert r.status_code == 404 and r.headers["x-request-id"] == given


async def test_a_request_without_an_id_gets_a_new_one_each_time(client: httpx.AsyncClient) -> None:
    ids = {(await client.get("/healthz")).headers["x-request-id"] for _ in range(5)}
    assert len(ids) == 5 and all(HEX32.fullmatch(i) for i in ids)


BAD_REQUEST_IDS = [
    "x" * 129,
    "y" * 5000,
    "has space",
    "semi;colon",
    'quote"',
    "new\\nline",
    "<script>",
    "é",
]


async def _served_under_a_new_id(
    client: httpx.AsyncClient,
    db: asyncpg.Connection,
    json_logs: Callable[[], list[dict[str, Any]]],
    bad: str,
) -> None:
    """The request is served as if it came without an id: a new one is made,
    echoed and on its log lines, and the one given is logged once, escaped and cut."""
    name = f"Dr. {uuid.uuid4()}"
    json_logs()  # forget earlier lines
    r = await client.post(
        "/api/doctors",
        json={"name": name, "timezone": "UTC"},
        headers={**ADMIN, "X-Request-ID": bad.encode("utf-8")},
    )
    assert r.status_code == 201, (bad, r.text)
    rid = r.headers["x-request-id"]
    assert HEX32.fullmatch(rid), rid
    assert await db.fetchval("SELECT count(*) FROM doctor WHERE name = $1", name) == 1
    replaced = [line for line in json_logs() if line["event"] == "request_id_replaced"]
    assert len(replaced) == 1, replaced
    assert replaced[0]["request_id"] == rid
    assert replaced[0]["given_bytes"] == len(bad.encode("utf-8"))
    shown = replaced[0]["given"]
    assert len(shown) <= tracing.REQUEST_ID_MAX and shown.isascii() and shown.isprintable()
    assert bad.startswith(shown) or "\\" in shown  # the id itself, or escaped


@pytest.mark.parametrize("bad", BAD_REQUEST_IDS)
async def test_a_bad_request_id_is_replaced_not_refused(
    client: httpx.AsyncClient,
    db: asyncpg.Connection,
    json_logs: Callable[[], list[dict[str, Any]]],
    bad: str,
) -> None:
    await _served_under_a_new_id(client, db, json_logs, bad)


async def test_a_bad_request_id_is_replaced_on_the_traced_path_too(
    client: httpx.AsyncClient,
    db: asyncpg.Connection,
    json_logs: Callable[[], list[dict[str, Any]]],
    spans: Any,
) -> None:
    """With an exporter requests take the middleware's other path."""
    for bad in BAD_REQUEST_IDS:
        await _served_under_a_new_id(client, db, json_logs, bad)


async def test_a_bad_traceparent_starts_a_new_trace(
    client: httpx.AsyncClient, db: asyncpg.Connection
) -> None:
    _, slots = await make_slots(client)
    patient = new_id()
    r = await client.post(
        "/api/appointments",
        json={"slotId": slots[0]["id"], "patientId": patient},
        headers={
            **auth("patient", patient),
            "Idempotency-Key": str(uuid.uuid4()),
            "traceparent": f"00-{'0' * 32}-00f067aa0ba902b7-01",
        },
    )
    assert r.status_code == 201, r.text  # the standard: ignore it, never refuse
    row = await db.fetchrow(
        "SELECT traceparent FROM outbox WHERE payload->>'appointmentId' = $1", str(r.json()["id"])
    )
    got = tracing.parse_traceparent(row["traceparent"])
    assert got is not None and got.trace_id != "0" * 32


# ------------------------------------------------------------- one trace, spans


@pytest.fixture
def spans() -> Iterator[Any]:
    """Spans recorded in memory, as an OTLP exporter would get them."""
    sdk = pytest.importorskip("opentelemetry.sdk.trace", reason="opentelemetry-sdk")
    from opentelemetry.sdk.trace.export import SimpleSpanProcessor
    from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

    exporter = InMemorySpanExporter()
    provider = sdk.TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    tracing.use_provider(provider)
    try:
        yield exporter
    finally:
        tracing.use_provider(None)
        provider.shutdown()


def _hex(n: int, width: int) -> str:
    return f"{n:0{width}x}"


@pytest.mark.parametrize("incoming", [None, PARENT], ids=["started", "accepted"])
async def test_one_trace_from_a_bookings_post_to_its_confirmation(
    client: httpx.AsyncClient,
    container: Container,
    db: asyncpg.Connection,
    spans: Any,
    incoming: str | None,
) -> None:
    _, slots = await make_slots(client)
    patient = new_id()
    headers = {**auth("patient", patient), "Idempotency-Key": str(uuid.uuid4())}
    if incoming:
        headers["traceparent"] = incoming
    r = await client.post(
        "/api/appointments", json={"slotId": slots[0]["id"], "patientId": patient}, headers=headers
    )
    assert r.status_code == 201, r.text
    await drain(container.module(Outbox).relay)
    sent = await db.fetchval(
        "SELECT count(*) FROM notification WHERE recipient = $1 AND status = 'SENT'", patient
    )
    assert sent == 1

    finished = spans.get_finished_spans()
    server = [
        s
        for s in finished
        if s.name == "POST /api/appointments"
        and s.attributes.get("http.response.status_code") == 201
    ]
    assert server, [s.name for s in finished]
    trace_id = server[-1].context.trace_id
    if incoming:
        assert _hex(trace_id, 32) == TRACE_ID
        assert _hex(server[-1].parent.span_id, 16) == "00f067aa0ba902b7"
    ours = [s for s in finished if s.context.trace_id == trace_id]
    by_id = {s.context.span_id: s for s in ours}
    names = [s.name for s in ours]
    consume = [
        s
        for s in ours
        if s.name == "appointments.appointment.booked.v1 process"
        and s.attributes.get("messaging.consumer.group.name") == "notifications"
    ]
    notify = [s for s in ours if s.name == "notify log"]
    assert len(consume) == 1 and len(notify) == 1, names
    # POST -> consumer (through the outbox row) -> notification, one chain.
    assert consume[0].parent.span_id == server[-1].context.span_id
    assert notify[0].parent.span_id == consume[0].context.span_id
    assert by_id[consume[0].parent.span_id] is server[-1]
    # The outbox row carried the request's context.
    row = await db.fetchrow(
        "SELECT traceparent, request_id FROM outbox WHERE payload->>'appointmentId' = $1",
        str(r.json()["id"]),
    )
    ctx = tracing.parse_traceparent(row["traceparent"])
    assert ctx is not None and ctx.trace_id == _hex(trace_id, 32)
    assert row["request_id"] == r.headers["x-request-id"]


# -------------------------------------------------------------------- log lines


@pytest.fixture
def json_logs(monkeypatch: pytest.MonkeyPatch) -> Iterator[Callable[[], list[dict[str, Any]]]]:
    """The process's logging as `reservo` configures it (JSON lines on stderr),
    read back line by line; the test session's logging restored afterwards."""
    saved = structlog.get_config()
    root = logging.getLogger()
    handlers, level = list(root.handlers), root.level
    stderr = io.StringIO()
    monkeypatch.setattr(sys, "stderr", stderr)
    configure("INFO", json=True)
    # Not cached: loggers first used here must not keep this test's stderr.
    structlog.configure(cache_logger_on_first_use=False)
    read = 0

    def lines() -> list[dict[str, Any]]:
        nonlocal read
        text = stderr.getvalue()
        new, read = text[read:], len(text)
        return [orjson.loads(line) for line in new.splitlines() if line.strip()]

    try:
        yield lines
    finally:
        structlog.configure(**saved)
        for h in list(root.handlers):
            root.removeHandler(h)
        for h in handlers:
            root.addHandler(h)
        root.setLevel(level)
        logging.captureWarnings(False)
        sys.excepthook = sys.__excepthook__
        threading.excepthook = threading.__excepthook__


@pytest.fixture
async def logged(base_settings: Settings) -> AsyncIterator[tuple[httpx.AsyncClient, Container]]:
    """An app with one log line per request."""
    container = build(base_settings.with_(access_log=True), OffsetClock())
    app = create_app(container, owns_container=False)
    transport = httpx.ASGITransport(app=app)
    async with httpx.AsyncClient(transport=transport, base_url="http://reservo.test") as c:
        yield c, container
    await container.close()


async def test_request_id_on_the_log_lines_of_the_request_and_of_its_events(
    logged: tuple[httpx.AsyncClient, Container],
    json_logs: Callable[[], list[dict[str, Any]]],
) -> None:
    client, container = logged
    _, slots = await make_slots(client)
    json_logs()  # forget the set-up's lines
    patient, rid = new_id(), f"booking-{uuid.uuid4()}"
    r = await client.post(
        "/api/appointments",
        json={"slotId": slots[0]["id"], "patientId": patient},
        headers={
            **auth("patient", patient),
            "Idempotency-Key": str(uuid.uuid4()),
            "X-Request-ID": rid,
            "traceparent": PARENT,
        },
    )
    assert r.status_code == 201, r.text
    await drain(container.module(Outbox).relay)
    lines = json_logs()
    mine = [line for line in lines if line.get("request_id") == rid]
    request = [line for line in mine if line["event"] == "request"]
    assert len(request) == 1 and request[0]["status"] == 201, lines
    assert request[0]["route"] == "/api/appointments"
    # The consumer's work on the booking's event: the notification it sent.
    sent = [line for line in mine if line["event"] == "notification"]
    assert len(sent) == 1 and sent[0]["user_id"] == patient, lines
    assert all(line["trace_id"] == TRACE_ID for line in mine)


async def test_stdlib_loggers_and_exceptions_are_one_json_line_each(
    json_logs: Callable[[], list[dict[str, Any]]],
) -> None:
    try:
        raise ValueError("boom\nsecond line")
    except ValueError:
        logging.getLogger("asyncpg.pool").exception("a library's failure")
    logging.getLogger("uvicorn.error").warning("Started server process [%d]", 42)
    lines = json_logs()
    failure = next(line for line in lines if line["event"] == "a library's failure")
    assert failure["logger"] == "asyncpg.pool" and failure["level"] == "error"
    assert "ValueError: boom" in failure["exception"]
    started = next(line for line in lines if line["event"] == "Started server process [42]")
    assert started["logger"] == "uvicorn.error" and started["level"] == "warning"


# ------------------------------------------------- traceresponse, the access log


async def _answers(client: httpx.AsyncClient, headers: dict[str, str]) -> list[httpx.Response]:
    """A booking (the hottest route), a FastAPI route, a 404."""
    _, slots = await make_slots(client)
    patient = new_id()
    booked = await client.post(
        "/api/appointments",
        json={"slotId": slots[0]["id"], "patientId": patient},
        headers={**auth("patient", patient), "Idempotency-Key": str(uuid.uuid4()), **headers},
    )
    assert booked.status_code == 201, booked.text
    health = await client.get("/healthz", headers=headers)
    missing = await client.get("/api/appointments/999999999", headers={**ADMIN, **headers})
    assert (health.status_code, missing.status_code) == (200, 404)
    return [booked, health, missing]


async def test_traceresponse_names_the_servers_span_in_the_callers_trace(
    client: httpx.AsyncClient,
) -> None:
    for r in await _answers(client, {"traceparent": PARENT}):
        got = tracing.parse_traceparent(r.headers["traceresponse"])
        assert got is not None, r.headers
        assert got.trace_id == TRACE_ID and got.sampled  # the caller's trace and decision
        assert got.span_id != "00f067aa0ba902b7"  # the server's span, a child of the caller's
    # No traceparent: the new trace's id, which is also the new request id.
    for r in await _answers(client, {}):
        got = tracing.parse_traceparent(r.headers["traceresponse"])
        assert got is not None and got.trace_id == r.headers["x-request-id"] and not got.sampled


async def test_traceresponse_is_the_exported_server_span(
    client: httpx.AsyncClient, spans: Any
) -> None:
    for r in await _answers(client, {"traceparent": PARENT}):
        got = tracing.parse_traceparent(r.headers["traceresponse"])
        assert got is not None and got.trace_id == TRACE_ID
        server = [
            s
            for s in spans.get_finished_spans()
            if _hex(s.context.span_id, 16) == got.span_id and s.kind.name == "SERVER"
        ]
        assert len(server) == 1, r.headers["traceresponse"]
        assert _hex(server[0].parent.span_id, 16) == "00f067aa0ba902b7"


def _request_lines(lines: list[dict[str, Any]], route: str) -> list[dict[str, Any]]:
    return [line for line in lines if line["event"] == "request" and line["route"] == route]


async def test_the_access_log_is_on_by_default(
    client: httpx.AsyncClient, json_logs: Callable[[], list[dict[str, Any]]]
) -> None:
    json_logs()
    rid = f"entry-{uuid.uuid4()}"
    r = await client.get("/healthz", headers={"X-Request-ID": rid})
    assert r.status_code == 200
    entry = _request_lines(json_logs(), "/healthz")
    assert len(entry) == 1, entry
    assert entry[0]["request_id"] == rid and entry[0]["status"] == 200
    assert entry[0]["trace_id"] == tracing.parse_traceparent(r.headers["traceresponse"]).trace_id


@pytest.fixture
async def sampled_log(
    base_settings: Settings,
) -> AsyncIterator[httpx.AsyncClient]:
    """One hot route's request in four logged."""
    container = build(base_settings.with_(access_log_sample=0.25), OffsetClock())
    app = create_app(container, owns_container=False)
    transport = httpx.ASGITransport(app=app)
    async with httpx.AsyncClient(transport=transport, base_url="http://reservo.test") as c:
        yield c
    await container.close()


async def test_hot_routes_are_sampled_the_rest_is_logged_whole(
    sampled_log: httpx.AsyncClient, json_logs: Callable[[], list[dict[str, Any]]]
) -> None:
    client = sampled_log
    doctor, _ = await make_slots(client)
    hot = "/api/doctors/{doctorId}/slots"
    url = f"/api/doctors/{doctor}/slots?date=2030-01-01"
    patient = auth("patient", new_id())
    json_logs()
    for _ in range(8):
        assert (await client.get(url, headers=patient)).status_code == 200
        assert (await client.get("/healthz")).status_code == 200
    lines = json_logs()
    assert len(_request_lines(lines, hot)) == 2, lines
    assert len(_request_lines(lines, "/healthz")) == 8
    # A sampled trace's requests are all logged: someone will look for them.
    for _ in range(4):
        r = await client.get(url, headers={**patient, "traceparent": PARENT})
        assert r.status_code == 200
    assert len(_request_lines(json_logs(), hot)) == 4


def test_errors_and_slow_requests_are_logged_whatever_the_share() -> None:
    log = AccessLog(sample=0.0, slow_ms=200, hot_paths=["/hot"])
    assert not any(log.wanted("/hot", 200, 0.01, False) for _ in range(100))
    assert not log.wanted("/hot", 409, 0.01, False)  # a storm's conflicts are its hot path
    assert log.wanted("/hot", 500, 0.01, False) and log.wanted("/hot", 503, 0.01, False)
    assert log.wanted("/hot", 200, 0.2, False)
    assert log.wanted("/hot", 200, 0.01, True)
    assert log.wanted("/cold", 200, 0.01, False)
    every_tenth = AccessLog(sample=0.1, slow_ms=200, hot_paths=["/hot"])
    assert sum(every_tenth.wanted("/hot", 201, 0.01, False) for _ in range(1000)) == 100
