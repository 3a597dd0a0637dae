"""The HTTP server's own refusals over raw sockets, against a real ``reservo api``
process (core/http/slow_clients.py): issue 38 item 4 and issue 39 item 3.

- A request the HTTP parser refuses is answered problem+json like every other
  error, not uvicorn's text/plain: 400 ``bad_request`` with the parser's reason,
  505 ``http_version_not_supported`` for a version other than 1.0 and 1.1.
- An answer given before the whole request arrived is followed by a lingering
  close: a client that sends a 20 MB body (declared, or chunked) and only then
  reads gets its complete 413, not a reset. So does a client still sending
  after a parser refusal."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Iterator

import httpx
import pytest

from reservo.settings import Settings
from tests.helpers.auth import auth
from tests.helpers.procs import env_for, free_port, running, wait_http

BIG = 20 * 1024 * 1024  # far past RESERVO_MAX_BODY_BYTES (1 MiB) and any socket buffer
PIECE = b"x" * 65_536
# Generous on a loaded 2-core machine: 20 MB through loopback, then the answer.
BOUND_S = 60.0
TOKEN = auth("admin", 1)["Authorization"]


@pytest.fixture(scope="module")
def api(base_settings: Settings, tmp_path_factory: pytest.TempPathFactory) -> Iterator[int]:
    port = free_port()
    log = tmp_path_factory.mktemp("wire") / "api.log"
    with running(["api", "--port", str(port)], env_for(base_settings), log) as proc:
        wait_http(f"http://127.0.0.1:{port}/healthz", proc, log)
        yield port


async def _send_then_read(port: int, head: bytes, body: Iterator[bytes] = iter(())) -> bytes:
    """Writes ``head``, then every piece of ``body`` (waiting for each to be taken),
    and only then reads until the server closes: what a client that sends its
    whole request before reading sees. A reset on the way fails the test."""
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    try:
        writer.write(head)
        for piece in body:
            writer.write(piece)
            await writer.drain()
        await writer.drain()
        return await asyncio.wait_for(reader.read(), BOUND_S)
    finally:
        writer.close()


def _problem(raw: bytes, status: int, code: str) -> dict[str, object]:
    """The answer, checked whole: status line, problem+json headers, a body of
    exactly its Content-Length that parses, with the problem's five fields."""
    head, sep, body = raw.partition(b"\r\n\r\n")
    assert sep, raw[:300]
    lines = head.decode("latin-1").split("\r\n")
    assert lines[0].startswith(f"HTTP/1.1 {status} "), raw[:300]
    headers = dict(line.lower().split(": ", 1) for line in lines[1:])
    assert headers["content-type"] == "application/problem+json", raw[:300]
    assert headers["connection"] == "close", raw[:300]
    assert int(headers["content-length"]) == len(body), raw[:300]
    problem: dict[str, object] = json.loads(body)
    assert {"type", "title", "status", "detail", "code"} <= set(problem), problem
    assert (problem["status"], problem["code"]) == (status, code), problem
    return problem


def _pieces(total: int) -> Iterator[bytes]:
    sent = 0
    while sent < total:
        piece = PIECE[: total - sent]
        sent += len(piece)
        yield piece


def _chunked(total: int) -> Iterator[bytes]:
    for piece in _pieces(total):
        yield b"%x\r\n" % len(piece) + piece + b"\r\n"
    yield b"0\r\n\r\n"


def _post(*headers: str) -> bytes:
    lines = ["POST /api/doctors HTTP/1.1", "Host: reservo.test", f"Authorization: {TOKEN}"]
    lines += ["Content-Type: application/json", *headers]
    return ("\r\n".join(lines) + "\r\n\r\n").encode()


# -- the parser's refusals are problem+json --------------------------------------------------


@pytest.mark.parametrize(
    ("request_bytes", "status", "code"),
    [
        (b"GET /healthz HTTP/1.1\r\nHost: x\r\nX-\x7fA: 1\r\n\r\n", 400, "bad_request"),
        (
            _post("Content-Length: 5", "Transfer-Encoding: chunked") + b"0\r\n\r\n",
            400,
            "bad_request",
        ),
        (_post("Content-Length: -1"), 400, "bad_request"),
        (
            _post("Content-Length: 1", "Content-Length: 2"),
            400,
            "bad_request",
        ),
        (_post("Transfer-Encoding: chunked") + b"zz\r\n", 400, "bad_request"),
        (b"G@T /healthz HTTP/1.1\r\nHost: x\r\n\r\n", 400, "bad_request"),
        (b"GET /healthz HTTP/9.9\r\nHost: x\r\n\r\n", 505, "http_version_not_supported"),
        (b"GET /healthz HTTP/2.0\r\nHost: x\r\n\r\n", 505, "http_version_not_supported"),
        (b"GET /healthz HTTP/0.9\r\nHost: x\r\n\r\n", 505, "http_version_not_supported"),
    ],
    ids=[
        "header-name-0x7f",
        "content-length-and-chunked",
        "content-length-negative",
        "content-length-twice",
        "chunk-size-not-hex",
        "method-not-a-token",
        "http-9.9",
        "http-2.0",
        "http-0.9",
    ],
)
async def test_a_request_the_parser_refuses_is_answered_problem_json(
    api: int, request_bytes: bytes, status: int, code: str
) -> None:
    problem = _problem(await _send_then_read(api, request_bytes), status, code)
    if status == 400:  # the parser's reason, for whoever debugs the client
        assert str(problem["detail"]).startswith("the request is not valid HTTP/1.1"), problem
    async with httpx.AsyncClient(timeout=10) as http:  # and the server goes on
        assert (await http.get(f"http://127.0.0.1:{api}/healthz")).status_code == 200


async def test_a_client_still_sending_after_a_parser_refusal_reads_it_whole(api: int) -> None:
    """Refused on its headers; 20 MB of body follow, then the client reads."""
    head = _post(f"Content-Length: {BIG}", "Transfer-Encoding: chunked")
    _problem(await _send_then_read(api, head, _pieces(BIG)), 400, "bad_request")


async def test_a_version_refusal_is_read_whole_by_a_client_still_sending(api: int) -> None:
    head = b"POST /api/doctors HTTP/2.0\r\nHost: x\r\nContent-Length: %d\r\n\r\n" % BIG
    _problem(await _send_then_read(api, head, _pieces(BIG)), 505, "http_version_not_supported")


async def test_a_refused_pipelined_request_is_answered_after_the_one_before_it(api: int) -> None:
    """Two requests in one write, the second one refused by the parser: the first
    gets its answer, then the second its 400, in order, then the close (the
    refusal was written before the first answer, which then failed to be sent)."""
    first = b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n"
    second = b"GET /healthz HTTP/1.1\r\nHost: x\r\nX-\x7fA: 1\r\n\r\n"
    raw = await _send_then_read(api, first + second)
    head, _, rest = raw.partition(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 200 "), raw[:300]
    length = next(
        int(line.split(b":", 1)[1])
        for line in head.split(b"\r\n")
        if line.lower().startswith(b"content-length:")
    )
    assert json.loads(rest[:length])["status"] == "ok", raw[:300]
    _problem(rest[length:], 400, "bad_request")


# -- a 413 reaches a client that is still sending ---------------------------------------------


async def test_a_declared_20_mb_body_is_a_complete_413_after_the_client_sent_it_all(
    api: int,
) -> None:
    raw = await _send_then_read(api, _post(f"Content-Length: {BIG}"), _pieces(BIG))
    _problem(raw, 413, "payload_too_large")


async def test_a_chunked_body_past_the_limit_is_a_complete_413_after_the_client_sent_it_all(
    api: int,
) -> None:
    raw = await _send_then_read(api, _post("Transfer-Encoding: chunked"), _chunked(BIG))
    _problem(raw, 413, "payload_too_large")


async def test_a_body_within_the_limit_is_still_served(api: int) -> None:
    body = json.dumps({"name": "Dr. Wire", "timezone": "Europe/Lisbon"}).encode()
    raw = await _send_then_read(
        api, _post(f"Content-Length: {len(body)}", "Connection: close"), iter((body,))
    )
    assert raw.startswith(b"HTTP/1.1 201 "), raw[:300]
