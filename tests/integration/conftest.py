"""Fixtures of the integration tests beyond the session's own (tests/conftest.py)."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Iterator
from typing import Any

import pytest
from aiosmtpd.controller import Controller
from aiosmtpd.smtp import AuthResult, LoginPassword

from tests.helpers.notify import Collector, HttpSink, SmtpSink, read_request
from tests.helpers.procs import free_port


@pytest.fixture
def smtp_server() -> Iterator[SmtpSink]:
    collector = Collector()
    port = free_port()
    state = SmtpSink(port=port, collector=collector)

    def authenticator(
        server: Any, session: Any, envelope: Any, mechanism: str, auth_data: Any
    ) -> AuthResult:
        ok = isinstance(auth_data, LoginPassword) and auth_data.password == b"s3cret"
        if ok:
            state.logins.append(auth_data.login.decode())
        # handled=False: let aiosmtpd send the 235/535 reply itself.
        return AuthResult(success=ok, handled=False)

    controller = Controller(
        collector,
        hostname="127.0.0.1",
        port=port,
        authenticator=authenticator,
        auth_require_tls=False,
    )
    controller.start()
    try:
        yield state
    finally:
        controller.stop()


@pytest.fixture
async def http_server() -> AsyncIterator[HttpSink]:
    state = HttpSink(url="")

    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            while (req := await read_request(reader)) is not None:
                state.requests.append(req)
                if state.hang:
                    await state.release.wait()  # until teardown
                body = b'{"ok": true}' if state.status < 300 else b"provider exploded"
                writer.write(
                    f"HTTP/1.1 {state.status} X\r\nContent-Length: {len(body)}\r\n"
                    "Content-Type: application/json\r\n\r\n".encode()
                    + body
                )
                await writer.drain()
        except (ConnectionError, asyncio.IncompleteReadError):
            pass
        finally:
            writer.close()

    server = await asyncio.start_server(handle, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    state.url = f"http://127.0.0.1:{port}/sms"
    try:
        yield state
    finally:
        state.release.set()
        server.close()
        await server.wait_closed()
