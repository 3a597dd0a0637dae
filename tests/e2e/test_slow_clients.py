"""Slow clients against a real ``reservo api`` process (core/http/slow_clients.py).

A socket that sends half a request line, headers without the blank line that ends
them, or a Content-Length and then less body is answered 408 ``request_timeout``
and closed once the (here shortened) timeout passes; one that sends nothing is
closed silently. Beyond RESERVO_HTTP_MAX_CONNECTIONS a new connection is closed at
once, and the connections already open are served. Normal requests, kept-alive
connections idle between requests, bodies sent in parts and a booking storm are
untouched."""

from __future__ import annotations

import asyncio
import json
import time
import uuid
from collections import Counter
from collections.abc import Generator, Iterator
from pathlib import Path

import httpx
import pytest

from reservo.settings import Settings
from tests.helpers.appointments import make_slots
from tests.helpers.auth import auth, new_id
from tests.helpers.procs import env_for, free_port, running, wait_http

HEADER_S = 1.0
BODY_S = 1.5
# What a closed socket may take beyond its timeout on a loaded 2-core machine.
SLACK_S = 4.0

HALF_LINE = b"GET /hea"
HEADERS_UNFINISHED = b"GET /healthz HTTP/1.1\r\nHost: reservo.test\r\nX-Slow: 1\r\n"
BODY_SHORT = (
    b"POST /api/doctors HTTP/1.1\r\nHost: reservo.test\r\n"
    b"Content-Type: application/json\r\nContent-Length: 100\r\n\r\n{"
)


def _serve(
    settings: Settings, log: Path, command: str = "api", **limits: str
) -> Generator[tuple[str, int]]:
    port = free_port()
    env = env_for(settings, **{f"RESERVO_HTTP_{k.upper()}": v for k, v in limits.items()})
    with running([command, "--port", str(port)], env, log) as proc:
        wait_http(f"http://127.0.0.1:{port}/healthz", proc, log)
        yield f"http://127.0.0.1:{port}", port


@pytest.fixture(scope="module")
def api(
    base_settings: Settings, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[tuple[str, int]]:
    yield from _serve(
        base_settings,
        tmp_path_factory.mktemp("slow") / "api.log",
        header_timeout_s=str(HEADER_S),
        body_timeout_s=str(BODY_S),
        keepalive_timeout_s="5",
        max_connections="1000",
    )


async def _until_closed(port: int, payload: bytes, bound_s: float) -> tuple[bytes, float]:
    """Send ``payload`` and read until the server closes: (everything read, seconds)."""
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    t0 = time.monotonic()
    try:
        if payload:
            writer.write(payload)
            await writer.drain()
        try:
            data = await asyncio.wait_for(reader.read(), bound_s)
        except ConnectionResetError:
            data = b""
        return data, time.monotonic() - t0
    finally:
        writer.close()


def _status_and_body(raw: bytes) -> tuple[int, dict[str, object], bytes]:
    head, _, body = raw.partition(b"\r\n\r\n")
    return int(head.split(b" ", 2)[1]), json.loads(body), head.lower()


@pytest.mark.parametrize(
    ("payload", "timeout_s"),
    [(HALF_LINE, HEADER_S), (HEADERS_UNFINISHED, HEADER_S), (BODY_SHORT, BODY_S)],
    ids=["half-request-line", "headers-unfinished", "body-short"],
)
async def test_a_slow_request_is_answered_408_and_closed(
    api: tuple[str, int], payload: bytes, timeout_s: float
) -> None:
    _, port = api
    raw, took = await _until_closed(port, payload, timeout_s + SLACK_S)
    status, body, head = _status_and_body(raw)
    assert status == 408 and body["code"] == "request_timeout", raw
    assert b"content-type: application/problem+json" in head and b"connection: close" in head
    assert timeout_s * 0.9 <= took <= timeout_s + SLACK_S


async def test_a_connection_that_sends_nothing_is_closed(api: tuple[str, int]) -> None:
    _, port = api
    raw, took = await _until_closed(port, b"", HEADER_S + SLACK_S)
    assert raw == b"" and HEADER_S * 0.9 <= took <= HEADER_S + SLACK_S


async def test_a_body_trickled_byte_by_byte_is_cut_at_the_body_deadline(
    api: tuple[str, int],
) -> None:
    # Every byte arrives well within any per-read timeout: only a whole-body
    # deadline stops it.
    _, port = api
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    t0 = time.monotonic()
    answer = asyncio.create_task(reader.read())
    try:
        writer.write(BODY_SHORT)
        while not answer.done() and time.monotonic() - t0 < BODY_S + SLACK_S:
            writer.write(b" ")
            await writer.drain()
            await asyncio.sleep(0.2)
    except OSError:
        pass  # closed by the server between two bytes
    try:
        raw = await asyncio.wait_for(answer, SLACK_S)
    except ConnectionResetError:
        raw = b""
    finally:
        writer.close()
    assert _status_and_body(raw)[0] == 408, raw
    assert time.monotonic() - t0 <= BODY_S + SLACK_S


async def test_many_slow_sockets_are_all_closed_and_service_goes_on(
    api: tuple[str, int],
) -> None:
    base, port = api
    kinds = [b"", HALF_LINE, HEADERS_UNFINISHED, BODY_SHORT] * 75
    gate = asyncio.Event()

    async def one(payload: bytes) -> tuple[bytes, float]:
        await gate.wait()
        return await _until_closed(port, payload, BODY_S + 2 * SLACK_S)

    tasks = [asyncio.create_task(one(p)) for p in kinds]
    await asyncio.sleep(0.05)
    gate.set()
    async with httpx.AsyncClient(base_url=base, timeout=10) as http:
        # While 300 sockets hang, the server answers others.
        await asyncio.sleep(0.3)
        assert (await http.get("/healthz")).status_code == 200
        results = await asyncio.gather(*tasks)
        statuses = Counter(raw.split(b" ", 2)[1] if raw else b"closed" for raw, _ in results)
        assert statuses == {b"408": 225, b"closed": 75}, statuses
        assert (await http.get("/healthz")).status_code == 200


async def test_kept_alive_idle_and_bodies_in_parts_are_served(api: tuple[str, int]) -> None:
    base, port = api
    async with httpx.AsyncClient(base_url=base, timeout=10) as http:
        for _ in range(3):
            assert (await http.get("/healthz")).status_code == 200
            # Idle between requests longer than the header timeout: the keep-alive
            # timeout (5 s) governs it, and the next request is served.
            await asyncio.sleep(HEADER_S * 1.5)

    # A body in three parts, each well within the body deadline.
    body = json.dumps({"name": "Dr. Parts", "timezone": "Europe/Lisbon"}).encode()
    token = auth("admin", 1)["Authorization"]
    head = (
        f"POST /api/doctors HTTP/1.1\r\nHost: reservo.test\r\nAuthorization: {token}\r\n"
        f"Content-Type: application/json\r\nContent-Length: {len(body)}\r\n"
    ).encode()
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    try:
        for part in (head, b"\r\n" + body[:10], body[10:]):
            writer.write(part)
            await writer.drain()
            await asyncio.sleep(HEADER_S * 0.4)
        status_line = await asyncio.wait_for(reader.readline(), 10)
        assert status_line.split(b" ", 2)[1] == b"201", status_line
    finally:
        writer.close()


async def test_a_booking_storm_is_untouched(api: tuple[str, int]) -> None:
    base, _ = api
    limits = httpx.Limits(max_connections=40)
    async with httpx.AsyncClient(base_url=base, timeout=30, limits=limits) as http:
        _, slots = await make_slots(http, capacity=3)
        slot = slots[0]["id"]
        gate = asyncio.Event()

        async def one() -> int:
            patient = new_id()
            await gate.wait()
            r = await http.post(
                "/api/appointments",
                json={"slotId": slot, "patientId": patient},
                headers={**auth("patient", patient), "Idempotency-Key": str(uuid.uuid4())},
            )
            return r.status_code

        tasks = [asyncio.create_task(one()) for _ in range(60)]
        await asyncio.sleep(0.05)
        gate.set()
        statuses = Counter(await asyncio.gather(*tasks))
    assert statuses == {201: 3, 409: 57}, statuses


@pytest.fixture(scope="module")
def capped(
    base_settings: Settings, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[tuple[str, int]]:
    yield from _serve(
        base_settings,
        tmp_path_factory.mktemp("capped") / "api.log",
        header_timeout_s="30",
        max_connections="20",
    )


async def test_the_connection_cap_holds(capped: tuple[str, int]) -> None:
    base, port = capped
    held = [await asyncio.open_connection("127.0.0.1", port) for _ in range(20)]
    try:
        for _, writer in held:  # each sends half a request and waits
            writer.write(b"GET /healthz HTTP/1.1\r\nHost: reservo.test\r\n")
            await writer.drain()
        await asyncio.sleep(0.5)
        # The cap is reached: more connections are closed at once, unanswered.
        for _ in range(5):
            raw, took = await _until_closed(
                port, b"GET /healthz HTTP/1.1\r\nHost: reservo.test\r\n\r\n", 5
            )
            assert raw == b"" and took < 5
        # The connections already open are served.
        for reader, writer in held:
            writer.write(b"\r\n")
            await writer.drain()
            line = await asyncio.wait_for(reader.readline(), 10)
            assert line.startswith(b"HTTP/1.1 200"), line
    finally:
        for _, writer in held:
            writer.close()
    await asyncio.sleep(0.5)
    async with httpx.AsyncClient(base_url=base, timeout=10) as http:
        assert (await http.get("/healthz")).status_code == 200  # room again


async def test_reservo_up_serves_with_the_same_limits(
    base_settings: Settings, own_database: str, tmp_path: Path
) -> None:
    settings = base_settings.with_(database_url=own_database)
    served = _serve(settings, tmp_path / "up.log", "up", header_timeout_s="1", max_connections="3")
    _, port = next(served)
    try:
        raw, _ = await _until_closed(port, HEADERS_UNFINISHED, 1 + SLACK_S)
        assert _status_and_body(raw)[0] == 408, raw
        held = [await asyncio.open_connection("127.0.0.1", port) for _ in range(3)]
        await asyncio.sleep(0.3)
        raw, took = await _until_closed(port, b"GET /healthz HTTP/1.1\r\n\r\n", 5)
        assert raw == b"" and took < 5
        for _, writer in held:
            writer.close()
    finally:
        served.close()


@pytest.fixture(scope="module")
def small_headers(
    base_settings: Settings, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[tuple[str, int]]:
    yield from _serve(
        base_settings, tmp_path_factory.mktemp("headers") / "api.log", max_header_bytes="4096"
    )


@pytest.mark.parametrize(
    "head",
    [
        b"GET /healthz HTTP/1.1\r\nHost: reservo.test\r\nX-Big: " + b"a" * 50_000,
        b"GET /healthz?" + b"q" * 50_000,
        b"GET /healthz HTTP/1.1\r\n" + b"X-Many: 1\r\n" * 5_000,
        # Far more than the socket buffers hold: still sending when answered, so
        # a plain close would reset the connection and lose the 431.
        b"GET /healthz HTTP/1.1\r\n" + b"X-Many: 1\r\n" * 200_000,
    ],
    ids=["one-huge-value", "huge-request-line", "many-headers", "still-sending"],
)
async def test_headers_past_the_cap_are_431_and_closed(
    small_headers: tuple[str, int], head: bytes
) -> None:
    """Sent fast (no timeout helps here): the server stops keeping them at the cap."""
    raw, _ = await _until_closed(small_headers[1], head, SLACK_S + 5)
    status, body, _ = _status_and_body(raw)
    assert status == 431 and body["code"] == "headers_too_large", raw[:300]
    async with httpx.AsyncClient(base_url=small_headers[0], timeout=10) as http:
        ok = await http.get("/healthz", headers={"X-Fits": "b" * 3000})
    assert ok.status_code == 200


def _writes(pid: int) -> int:
    """The write system calls (``syscw``) made so far by process ``pid`` and
    every process under it (an API's workers)."""
    total, todo = 0, [pid]
    while todo:
        p = todo.pop()
        with open(f"/proc/{p}/io") as io:
            total += next(int(line.split()[1]) for line in io if line.startswith("syscw:"))
        for task in Path(f"/proc/{p}/task").iterdir():
            todo += [int(c) for c in (task / "children").read_text().split()]
    return total


@pytest.mark.skipif(not Path("/proc/self/io").exists(), reason="no /proc/<pid>/io here")
def test_a_small_answer_goes_out_in_one_write(base_settings: Settings, tmp_path: Path) -> None:
    """The head and the body of an answer leave in one send (one TCP segment),
    not two: 200 requests on one kept-alive connection cost the server fewer
    than 1.5 writes each (2 or more each before; the access log is off so that
    its lines are not counted)."""
    requests = 200
    env = env_for(base_settings, RESERVO_ACCESS_LOG="false")
    port = free_port()
    log = tmp_path / "api.log"
    with running(["api", "--port", str(port)], env, log) as proc:
        wait_http(f"http://127.0.0.1:{port}/healthz", proc, log)
        with httpx.Client(base_url=f"http://127.0.0.1:{port}") as client:
            assert client.get("/healthz").status_code == 200  # the connection opened
            before = _writes(proc.pid)
            for _ in range(requests):
                assert client.get("/healthz").status_code == 200
            per_request = (_writes(proc.pid) - before) / requests
    assert per_request < 1.5, f"{per_request:.2f} writes per answer"
