"""A refund the gateway refuses (4xx) is a permanent failure, parked; an outage
(5xx, refused connection) is transient, retried until the gateway is back."""

from __future__ import annotations

import asyncio
import socket
from collections.abc import AsyncIterator

import pytest

from reservo.core.messaging.failures import is_transient
from reservo.rentals.gateway import HttpGateway, RefundRefused, TransientGatewayError


async def _answering(status: str) -> tuple[asyncio.Server, int]:
    async def reply(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await reader.readuntil(b"\r\n\r\n")
        writer.write(
            f"HTTP/1.1 {status}\r\nContent-Length: 0\r\nConnection: close\r\n\r\n".encode()
        )
        await writer.drain()
        writer.close()

    server = await asyncio.start_server(reply, "127.0.0.1", 0)
    return server, server.sockets[0].getsockname()[1]


@pytest.fixture
async def refusing() -> AsyncIterator[int]:
    server, port = await _answering("400 Bad Request")
    async with server:
        yield port


@pytest.fixture
async def failing() -> AsyncIterator[int]:
    server, port = await _answering("503 Service Unavailable")
    async with server:
        yield port


def _closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


async def test_a_refused_refund_is_permanent(refusing: int) -> None:
    gateway = HttpGateway(f"http://127.0.0.1:{refusing}", None, attempts=1)
    try:
        with pytest.raises(RefundRefused) as caught:
            await gateway.refund(1, 100, "evt-1")
    finally:
        await gateway.aclose()
    assert not is_transient(caught.value)


@pytest.mark.parametrize("where", ["failing", "closed"])
async def test_a_gateway_outage_is_transient(where: str, failing: int) -> None:
    port = failing if where == "failing" else _closed_port()
    gateway = HttpGateway(f"http://127.0.0.1:{port}", None, attempts=1)
    try:
        with pytest.raises(TransientGatewayError) as caught:
            await gateway.refund(1, 100, "evt-1")
    finally:
        await gateway.aclose()
    assert is_transient(caught.value)
