"""The HTTP limits docs/OPERATIONS.md promises ("Input limits", "Slow clients",
the rate limits of docs/OPERATIONS.md and README.md), as a client on a socket
meets them: `reservo api --workers 2` and `reservo worker` as separate processes.

Every early refusal must be readable by the client that caused it: a client that
streams a 20 MB body and only then reads must read a whole 413, not a reset."""

from __future__ import annotations

import json
import socket
import time
import uuid
from datetime import UTC, datetime, timedelta

import httpx
import pytest

from tests.helpers.auth import ADMIN, auth, new_id
from tests.helpers.deployment import Deploy, Deployment

MAX_BODY = 1_048_576  # RESERVO_MAX_BODY_BYTES's default
MAX_HEADERS = 65_536  # RESERVO_HTTP_MAX_HEADER_BYTES's default
HEADER_TIMEOUT_S = 2.0  # RESERVO_HTTP_HEADER_TIMEOUT_S (15 by default), shortened here
STREAMED = 20 * 1024 * 1024
# What a refusal may take beyond its timeout on a loaded 2-core machine.
SLACK_S = 5.0


@pytest.fixture(scope="module")
async def split(deploy: Deploy) -> Deployment:
    return await deploy("split", http_header_timeout_s=HEADER_TIMEOUT_S)


def _parse(raw: bytes) -> tuple[int, dict[str, str], bytes]:
    """Status, headers (names lower-cased) and body of one HTTP/1.1 answer; the
    body must be complete (as long as its Content-Length)."""
    head, sep, body = raw.partition(b"\r\n\r\n")
    assert sep, f"no complete answer head: {raw[:300]!r}"
    status_line, *lines = head.decode("latin-1").split("\r\n")
    headers = {}
    for line in lines:
        name, _, value = line.partition(":")
        headers[name.strip().lower()] = value.strip()
    assert len(body) == int(headers["content-length"]), f"a cut answer: {raw!r}"
    return int(status_line.split()[1]), headers, body


def _read_all(sock: socket.socket, bound_s: float) -> bytes:
    """Everything the server sends until it closes; a reset after a complete
    answer is the client's problem no more, a reset before it fails the test."""
    sock.settimeout(bound_s)
    data = b""
    try:
        while chunk := sock.recv(65536):
            data += chunk
    except ConnectionResetError:
        assert b"\r\n\r\n" in data, f"connection reset before an answer could be read: {data!r}"
    except TimeoutError:
        pass  # the server keeps the connection: what arrived is the answer
    return data


def _send_then_read(port: int, head: bytes, body_chunks: list[bytes]) -> tuple[str, bytes]:
    """Send ``head`` and then every body chunk, as a client that writes its whole
    request before it reads (most HTTP clients do), then read the answer: (how
    the sending ended, what was read)."""
    with socket.create_connection(("127.0.0.1", port)) as sock:
        sock.settimeout(30)
        sending = "sent"
        try:
            sock.sendall(head)
            for chunk in body_chunks:
                sock.sendall(chunk)
        except OSError as exc:  # reset, broken pipe, or the server stopped reading
            sending = repr(exc)
        return sending, _read_all(sock, 30)


def _problem(raw: bytes, status: int, code: str) -> dict[str, str]:
    got, headers, body = _parse(raw)
    assert got == status, raw[:500]
    assert headers["content-type"].startswith("application/problem+json"), headers
    problem: dict[str, str] = json.loads(body)
    assert problem["code"] == code and problem["status"] == status, problem
    return headers


@pytest.mark.parametrize("framing", ["content-length", "chunked"])
@pytest.mark.parametrize("path", ["/api/appointments", "/api/doctors"])
def test_a_20_mb_body_is_answered_a_readable_413(
    split: Deployment, path: str, framing: str
) -> None:
    # /api/appointments is a hot route (RESERVO_LEAN_PATHS), /api/doctors goes
    # through the middleware stack: both refuse the body.
    piece = b"x" * 65536
    if framing == "content-length":
        head = (
            f"POST {path} HTTP/1.1\r\nHost: reservo.test\r\nContent-Type: application/json\r\n"
            f"Content-Length: {STREAMED}\r\n\r\n"
        ).encode()
        chunks = [piece] * (STREAMED // len(piece))
    else:
        head = (
            f"POST {path} HTTP/1.1\r\nHost: reservo.test\r\nContent-Type: application/json\r\n"
            "Transfer-Encoding: chunked\r\n\r\n"
        ).encode()
        frame = b"%x\r\n%b\r\n" % (len(piece), piece)
        chunks = [frame] * (STREAMED // len(piece)) + [b"0\r\n\r\n"]
    sending, raw = _send_then_read(split.port, head, chunks)
    # A reset while the client still sends loses the answer for a client that
    # reads after sending: the server reads and drops the rest (a lingering close).
    assert sending == "sent", f"the 20 MB body could not be sent: {sending}; read {raw[:200]!r}"
    _problem(raw, 413, "payload_too_large")


def test_a_body_at_the_limit_is_read(split: Deployment) -> None:
    # The largest body allowed is read and judged (422: not a doctor), not refused 413.
    shape = json.dumps({"name": "", "timezone": "UTC"}).encode()
    body = json.dumps({"name": "x" * (MAX_BODY - len(shape)), "timezone": "UTC"}).encode()
    assert len(body) == MAX_BODY
    r = httpx.post(
        f"{split.url}/api/doctors",
        content=body,
        headers={**ADMIN, "Content-Type": "application/json"},
        timeout=30,
    )
    assert r.status_code != 413, r.text
    assert r.status_code < 500, r.text


def test_headers_beyond_the_limit_are_431(split: Deployment) -> None:
    head = (
        "GET /healthz HTTP/1.1\r\nHost: reservo.test\r\n"
        f"X-Big: {'y' * (MAX_HEADERS + 1024)}\r\n\r\n"
    ).encode()
    sending, raw = _send_then_read(split.port, head, [])
    assert sending == "sent", sending
    headers = _problem(raw, 431, "headers_too_large")
    assert headers.get("connection") == "close", headers


def test_headers_that_never_end_are_408_after_the_header_timeout(split: Deployment) -> None:
    with socket.create_connection(("127.0.0.1", split.port)) as sock:
        t0 = time.monotonic()
        sock.sendall(b"GET /healthz HTTP/1.1\r\nHost: reservo.test\r\nX-Slow: 1\r\n")
        raw = _read_all(sock, HEADER_TIMEOUT_S + SLACK_S)
        took = time.monotonic() - t0
    headers = _problem(raw, 408, "request_timeout")
    assert headers.get("connection") == "close", headers
    assert HEADER_TIMEOUT_S * 0.9 <= took <= HEADER_TIMEOUT_S + SLACK_S, took


def _retry_after(r: httpx.Response) -> int:
    assert r.status_code == 429 and r.json()["code"] == "rate_limited", r.text
    return int(r.headers["Retry-After"])


def test_rental_holds_are_3_per_customer_per_15_minutes(split: Deployment) -> None:
    # README and docs/OPERATIONS.md: RESERVO_RENTALS_HOLD_RATE_LIMIT 3 per
    # RESERVO_RENTALS_HOLD_RATE_WINDOW_S 900; the 4th is 429 with Retry-After =
    # when the oldest counted hold leaves the window.
    customer = new_id()
    who = auth("customer", customer)
    with httpx.Client(base_url=split.url, timeout=30) as http:
        cars = []
        for _ in range(4):
            car = http.post(
                "/api/cars",
                headers=ADMIN,
                json={
                    "plate": f"ACC-{uuid.uuid4().hex[:8]}",
                    "model": "Test",
                    "city": "HN",
                    "dailyPrice": 10_000,
                    "hostId": new_id(),
                },
            )
            assert car.status_code == 201, car.text
            cars.append(car.json()["id"])
        start = datetime.now(UTC).replace(microsecond=0) + timedelta(days=30)
        period = {"from": start.isoformat(), "to": (start + timedelta(days=1)).isoformat()}
        answers = [
            http.post(
                "/api/bookings",
                headers={**who, "Idempotency-Key": str(uuid.uuid4())},
                json={"carId": car, "customerId": customer, **period},
            )
            for car in cars
        ]
    assert [a.status_code for a in answers[:3]] == [201, 201, 201], [a.text for a in answers]
    assert 800 <= _retry_after(answers[3]) <= 900, answers[3].headers


def test_bookings_are_5_per_patient_per_10_seconds(split: Deployment) -> None:
    # RESERVO_APPOINTMENTS_BOOKING_RATE_LIMIT 5 per ..._WINDOW_S 10: the 6th
    # attempt within the window is 429 with a Retry-After within the window.
    patient = new_id()
    who = auth("patient", patient)
    with httpx.Client(base_url=split.url, timeout=30) as http:
        answers = [
            http.post(
                "/api/appointments",
                headers={**who, "Idempotency-Key": str(uuid.uuid4())},
                json={"slotId": 2**40 + n, "patientId": patient},  # no such slot: 404
            )
            for n in range(6)
        ]
    assert [a.status_code for a in answers[:5]] == [404] * 5, [a.text for a in answers]
    assert 1 <= _retry_after(answers[5]) <= 10, answers[5].headers
