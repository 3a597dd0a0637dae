"""How the server writes answers (core/http/slow_clients.py's cycle transport):
a response's head waits for its body only within one turn of the event loop. A
streamed answer whose body comes later has its head on the wire at once, and
its chunks as they come. Served by uvicorn with reservo's protocol on a real
socket, in this process."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator

import pytest
import uvicorn
from starlette.types import Receive, Scope, Send

from reservo.core.http.slow_clients import HttpLimits, ServerConfig
from tests.helpers.procs import free_port
from tests.helpers.waiting import wait_until

PAUSE_S = 0.6


async def _slow_stream(scope: Scope, receive: Receive, send: Send) -> None:
    if scope["type"] != "http":
        return
    await send(
        {
            "type": "http.response.start",
            "status": 200,
            "headers": [(b"content-type", b"text/plain")],
        }
    )
    await asyncio.sleep(PAUSE_S)  # the body is still being produced
    await send({"type": "http.response.body", "body": b"first", "more_body": True})
    await asyncio.sleep(PAUSE_S)
    await send({"type": "http.response.body", "body": b"last"})


@pytest.fixture
async def server() -> AsyncIterator[int]:
    port = free_port()
    config = ServerConfig(_slow_stream, HttpLimits(), host="127.0.0.1", port=port, lifespan="off")
    srv = uvicorn.Server(config)
    task = asyncio.create_task(srv.serve())
    await wait_until(lambda: srv.started, what="the server to start")
    yield port
    srv.should_exit = True
    await task


async def test_a_streamed_answer_s_head_is_not_held_for_its_body(server: int) -> None:
    reader, writer = await asyncio.open_connection("127.0.0.1", server)
    try:
        writer.write(b"GET / HTTP/1.1\r\nHost: t\r\n\r\n")
        await writer.drain()
        sent = time.monotonic()
        head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 5)
        head_s = time.monotonic() - sent
        assert head.startswith(b"HTTP/1.1 200"), head
        assert b"transfer-encoding: chunked" in head.lower()
        first = await asyncio.wait_for(reader.readuntil(b"first\r\n"), 5)
        first_s = time.monotonic() - sent
        rest = await asyncio.wait_for(reader.readuntil(b"0\r\n\r\n"), 5)
    finally:
        writer.close()
    assert head_s < PAUSE_S / 2, f"the head came {head_s:.2f} s after the request"
    assert PAUSE_S * 0.8 < first_s < 2 * PAUSE_S + 0.5, first_s
    assert first.endswith(b"first\r\n") and rest.endswith(b"last\r\n0\r\n\r\n")
