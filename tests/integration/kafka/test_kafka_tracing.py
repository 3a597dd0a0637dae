"""Traces and request ids over Kafka: a booking's ``traceparent`` and
``X-Request-ID`` come out in its Kafka record's headers (the outbox row carried
them to the relay); `reservo up --kafka` under a little load writes nothing but
JSON lines, and the consumer's lines for a request's event carry its request id
and trace id."""

from __future__ import annotations

import asyncio
import uuid
from collections import Counter
from collections.abc import AsyncIterator
from pathlib import Path

import asyncpg
import httpx
import orjson
import pytest

from reservo.app import create_app
from reservo.appointments import events as appointment_events
from reservo.bootstrap import Container, build
from reservo.core.kernel.clock import OffsetClock
from reservo.core_modules import Outbox
from reservo.settings import Settings
from tests.helpers.appointments import make_slots
from tests.helpers.auth import ADMIN, auth, new_id
from tests.helpers.kafka import read_topic
from tests.helpers.procs import env_for, free_port, running, wait_http

TRACE_ID = "0af7651916cd43dd8448eb211c80319c"
PARENT = f"00-{TRACE_ID}-b7ad6b7169203331-01"


@pytest.fixture
async def kafka_app(
    base_settings: Settings, kafka_database_url: str, kafka_bootstrap: str
) -> AsyncIterator[tuple[httpx.AsyncClient, Container]]:
    """The API on the Kafka tests' database, its relay publishing to the broker."""
    settings = base_settings.with_(
        database_url=kafka_database_url,
        kafka_bootstrap=kafka_bootstrap,
        kafka_idempotence=False,
        redis_namespace=f"{base_settings.redis_namespace}-ktrace-{uuid.uuid4().hex[:6]}",
    )
    container = build(settings, OffsetClock())
    app = create_app(container, owns_container=False)
    transport = httpx.ASGITransport(app=app)
    async with httpx.AsyncClient(transport=transport, base_url="http://reservo.test") as c:
        yield c, container
    await container.module(Outbox).relay.transport.stop()
    await container.close()


async def test_traceparent_and_request_id_in_come_out_in_the_records_headers(
    kafka_app: tuple[httpx.AsyncClient, Container], kafka_bootstrap: str
) -> None:
    client, container = kafka_app
    _, slots = await make_slots(client)
    patient, rid = new_id(), f"kafka-{uuid.uuid4()}"
    r = await client.post(
        "/api/appointments",
        json={"slotId": slots[0]["id"], "patientId": patient},
        headers={
            **auth("patient", patient),
            "Idempotency-Key": str(uuid.uuid4()),
            "traceparent": PARENT,
            "X-Request-ID": rid,
        },
    )
    assert r.status_code == 201, r.text
    for _ in range(50):
        if await container.module(Outbox).relay.run_once() == 0:
            break
    # Binary-mode CloudEvents: the event's name in ce_type, the payload alone as the value.
    booked = f"dev.reservo.{appointment_events.BOOKED}".encode()
    records = [
        rec
        for rec in await read_topic(kafka_bootstrap, appointment_events.APPOINTMENT_STREAM)
        if dict(rec.headers).get("ce_type") == booked
        and orjson.loads(rec.value)["appointmentId"] == r.json()["id"]
    ]
    assert len(records) == 1
    headers = dict(records[0].headers)
    version, trace_id, parent_id, flags = headers["traceparent"].decode().split("-")
    assert (version, trace_id, flags) == ("00", TRACE_ID, "01")
    assert len(parent_id) == 16
    assert headers["x-request-id"].decode() == rid


async def test_up_with_kafka_writes_only_json_lines(
    base_settings: Settings, own_database: str, tmp_path: Path
) -> None:
    port = free_port()
    settings = base_settings.with_(
        database_url=own_database,
        redis_namespace=f"{base_settings.redis_namespace}-json-{uuid.uuid4().hex[:6]}",
    )
    env = env_for(
        settings,
        RESERVO_DATA_DIR=str(tmp_path / "data"),  # the embedded broker lives here
        RESERVO_HTTP_PORT=str(port),
        RESERVO_OUTBOX_POLL_INTERVAL_S="0.05",
        RESERVO_KAFKA_SESSION_TIMEOUT_MS="6000",
        RESERVO_LOG_JSON="true",
        RESERVO_LOG_LEVEL="INFO",
        RESERVO_ACCESS_LOG="true",
    )
    env.pop("RESERVO_KAFKA_BOOTSTRAP", None)  # `--kafka` then starts its own broker
    log = tmp_path / "up.log"
    base = f"http://127.0.0.1:{port}"
    db = await asyncpg.connect(own_database)
    sent: dict[int, str] = {}  # patient -> the request id of their booking
    try:
        with running(["up", "--kafka"], env, log) as proc:
            await asyncio.to_thread(wait_http, f"{base}/readyz", proc, log, 60)
            async with httpx.AsyncClient(base_url=base, timeout=10) as client:
                _, slots = await make_slots(client, capacity=1, end="12:00")

                # A little load: bookings in parallel, each with its ids; some
                # refused (the same slot twice), one with a bad request id, one 404.
                async def one(i: int) -> None:
                    patient, rid = new_id(), f"up-{i}-{uuid.uuid4().hex[:8]}"
                    r = await client.post(
                        "/api/appointments",
                        json={"slotId": slots[i % 8]["id"], "patientId": patient},
                        headers={
                            **auth("patient", patient),
                            "Idempotency-Key": str(uuid.uuid4()),
                            "X-Request-ID": rid,
                            "traceparent": f"00-{uuid.uuid4().hex}-b7ad6b7169203331-01",
                        },
                    )
                    answers.append((r.status_code, r.json().get("code")))
                    if r.status_code == 201:
                        sent[patient] = rid

                answers: list[tuple[int, str | None]] = []
                await asyncio.gather(*(one(i) for i in range(16)))
                # Each of the 8 one-seat slots was asked twice: one booked, one refused.
                assert Counter(answers) == {(201, None): 8, (409, "slot_full"): 8}, answers
                # A malformed request id is replaced (and logged, as JSON), never refused.
                bad_id = await client.get("/healthz", headers={"X-Request-ID": "a b"})
                assert bad_id.status_code == 200
                assert bad_id.headers["x-request-id"] not in ("", "a b")
                assert (await client.get("/api/nothing-here", headers=ADMIN)).status_code == 404
                deadline = asyncio.get_running_loop().time() + 45
                while await db.fetchval(
                    "SELECT count(*) FROM notification WHERE recipient = ANY($1::bigint[])",
                    list(sent),
                ) < len(sent):
                    assert asyncio.get_running_loop().time() < deadline, log.read_text()[-3000:]
                    await asyncio.sleep(0.1)
    finally:
        await db.close()
    text = log.read_text()
    lines = [line for line in text.splitlines() if line.strip()]
    assert len(lines) > 20
    parsed = []
    for line in lines:
        try:
            parsed.append(orjson.loads(line))
        except orjson.JSONDecodeError:
            pytest.fail(f"not a JSON line: {line!r}\n--- whole log:\n{text[-4000:]}")
    assert all(isinstance(p, dict) for p in parsed)
    # Third-party loggers came through the same processors (uvicorn's at least).
    assert any(str(p.get("logger", "")).startswith("uvicorn") for p in parsed), text[-2000:]
    # Every booking's notification was logged by the consumer under its request id.
    notified = {p.get("user_id"): p for p in parsed if p.get("event") == "notification"}
    for patient, rid in sent.items():
        assert notified[patient].get("request_id") == rid, notified.get(patient)
        request = [p for p in parsed if p.get("event") == "request" and p.get("request_id") == rid]
        assert len(request) == 1 and request[0]["status"] == 201
        assert request[0]["trace_id"] == notified[patient]["trace_id"]
