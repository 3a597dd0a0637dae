"""Notification channels against real local servers (aiosmtpd, a raw asyncio HTTP server)."""

from __future__ import annotations

import asyncio
import email
import email.policy
import json
import socket
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass, field
from email.message import EmailMessage
from typing import Any

import pytest
from aiosmtpd.controller import Controller
from aiosmtpd.smtp import AuthResult, LoginPassword

from reservo.core.notify import (
    HttpChannel,
    LogChannel,
    Notification,
    NotificationError,
    SmtpChannel,
    build_channel,
)

TEMPLATE = "user-{user_id}@example.invalid"


def _free_port() -> int:
    """A port nothing listens on (bound then released)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _note(event_id: str = "evt-42") -> Notification:
    return Notification(
        recipient_user_id=7,
        subject="Your booking is confirmed — 10:00",
        body="See you tomorrow.\nRoom 3.",
        event_id=event_id,
    )


# --------------------------------------------------------------------------- SMTP


class _Collector:
    def __init__(self) -> None:
        self.messages: list[tuple[str, list[str], EmailMessage]] = []

    async def handle_DATA(self, server: Any, session: Any, envelope: Any) -> str:
        msg = email.message_from_bytes(envelope.content, policy=email.policy.default)
        assert isinstance(msg, EmailMessage)
        self.messages.append((envelope.mail_from, list(envelope.rcpt_tos), msg))
        return "250 OK"


@dataclass
class _Smtp:
    port: int
    collector: _Collector
    logins: list[str] = field(default_factory=list)


@pytest.fixture
def smtp_server() -> Iterator[_Smtp]:
    collector = _Collector()
    port = _free_port()
    state = _Smtp(port=port, collector=collector)

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


async def test_smtp_delivers_message(smtp_server: _Smtp) -> None:
    ch = SmtpChannel("127.0.0.1", smtp_server.port, "reservo@example.invalid", TEMPLATE)
    await ch.send(_note())

    [(mail_from, rcpts, msg)] = smtp_server.collector.messages
    assert mail_from == "reservo@example.invalid"
    assert rcpts == ["user-7@example.invalid"]
    assert msg["To"] == "user-7@example.invalid"
    assert msg["From"] == "reservo@example.invalid"
    assert msg["Subject"] == "Your booking is confirmed — 10:00"
    assert msg.get_content_type() == "text/plain"
    # On the wire lines end in CRLF; compare the text, not the line endings.
    assert msg.get_content().replace("\r\n", "\n").rstrip("\n") == "See you tomorrow.\nRoom 3."
    assert msg["X-Reservo-Event-Id"] == "evt-42"
    assert msg["Message-ID"] == "<notify.evt-42@example.invalid>"


async def test_smtp_resend_keeps_message_id(smtp_server: _Smtp) -> None:
    ch = SmtpChannel("127.0.0.1", smtp_server.port, "reservo@example.invalid", TEMPLATE)
    await ch.send(_note("evt 9 <x>"))
    await ch.send(_note("evt 9 <x>"))

    ids = [m["Message-ID"] for _, _, m in smtp_server.collector.messages]
    assert len(ids) == 2
    assert ids[0] == ids[1]
    assert " " not in ids[0] and ids[0].count("<") == 1
    assert smtp_server.collector.messages[0][2]["X-Reservo-Event-Id"] == "evt 9 <x>"


async def test_smtp_login(smtp_server: _Smtp) -> None:
    ch = SmtpChannel(
        "127.0.0.1",
        smtp_server.port,
        "reservo@example.invalid",
        TEMPLATE,
        username="reservo",
        password="s3cret",
    )
    await ch.send(_note())
    assert smtp_server.logins == ["reservo"]
    assert len(smtp_server.collector.messages) == 1


async def test_smtp_bad_password_raises(smtp_server: _Smtp) -> None:
    ch = SmtpChannel(
        "127.0.0.1",
        smtp_server.port,
        "reservo@example.invalid",
        TEMPLATE,
        username="reservo",
        password="wrong",
    )
    with pytest.raises(NotificationError, match=r"smtp 127\.0\.0\.1:\d+.*SMTPAuthenticationError"):
        await ch.send(_note())
    assert smtp_server.collector.messages == []


async def test_smtp_server_down_raises() -> None:
    port = _free_port()
    ch = SmtpChannel("127.0.0.1", port, "reservo@example.invalid", TEMPLATE, timeout_s=2.0)
    with pytest.raises(
        NotificationError, match=rf"127\.0\.0\.1:{port}: sending event evt-42"
    ) as info:
        await ch.send(_note())
    assert info.value.__cause__ is not None


def test_smtp_bad_template_fails_at_construction() -> None:
    with pytest.raises(ValueError, match="email_template"):
        SmtpChannel("127.0.0.1", 25, "a@b", "user-{uid}@example.invalid")


# --------------------------------------------------------------------------- HTTP


@dataclass
class _Request:
    method: str
    path: str
    headers: dict[str, str]
    body: bytes


@dataclass
class _Http:
    url: str
    requests: list[_Request] = field(default_factory=list)
    status: int = 200
    hang: bool = False
    release: asyncio.Event = field(default_factory=asyncio.Event)


async def _read_request(reader: asyncio.StreamReader) -> _Request | None:
    line = await reader.readline()
    if not line:
        return None
    method, path, _ = line.decode("latin-1").split(" ", 2)
    headers: dict[str, str] = {}
    while (raw := await reader.readline()) not in (b"\r\n", b"\n", b""):
        name, _, value = raw.decode("latin-1").partition(":")
        headers[name.strip().lower()] = value.strip()
    body = await reader.readexactly(int(headers.get("content-length", "0")))
    return _Request(method, path, headers, body)


@pytest.fixture
async def http_server() -> AsyncIterator[_Http]:
    state = _Http(url="")

    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            while (req := await _read_request(reader)) is not None:
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


async def test_http_posts_json_with_idempotency_key(http_server: _Http) -> None:
    ch = HttpChannel(http_server.url, token="tok-1")
    try:
        await ch.send(_note())
        await ch.send(_note("evt-43"))
    finally:
        await ch.aclose()

    first, second = http_server.requests
    assert first.method == "POST"
    assert first.path == "/sms"
    assert first.headers["idempotency-key"] == "evt-42"
    assert first.headers["authorization"] == "Bearer tok-1"
    assert first.headers["content-type"] == "application/json"
    assert json.loads(first.body) == {
        "to": 7,
        "subject": "Your booking is confirmed — 10:00",
        "body": "See you tomorrow.\nRoom 3.",
        "eventId": "evt-42",
    }
    assert second.headers["idempotency-key"] == "evt-43"


async def test_http_without_token_sends_no_authorization(http_server: _Http) -> None:
    ch = HttpChannel(http_server.url)
    try:
        await ch.send(_note())
    finally:
        await ch.aclose()
    assert "authorization" not in http_server.requests[0].headers


async def test_http_500_raises(http_server: _Http) -> None:
    http_server.status = 500
    ch = HttpChannel(http_server.url)
    try:
        with pytest.raises(NotificationError, match=r"500: 'provider exploded'"):
            await ch.send(_note())
    finally:
        await ch.aclose()
    assert len(http_server.requests) == 1


async def test_http_non_2xx_raises(http_server: _Http) -> None:
    http_server.status = 302
    ch = HttpChannel(http_server.url)
    try:
        with pytest.raises(NotificationError, match="302"):
            await ch.send(_note())
    finally:
        await ch.aclose()


async def test_http_timeout_raises(http_server: _Http) -> None:
    http_server.hang = True
    ch = HttpChannel(http_server.url, timeout_s=0.3)
    try:
        with pytest.raises(NotificationError, match="Timeout"):
            await ch.send(_note())
    finally:
        await ch.aclose()


async def test_http_server_down_raises() -> None:
    ch = HttpChannel(f"http://127.0.0.1:{_free_port()}/sms", timeout_s=2.0)
    try:
        with pytest.raises(NotificationError, match="ConnectError") as info:
            await ch.send(_note())
    finally:
        await ch.aclose()
    assert info.value.__cause__ is not None


# --------------------------------------------------------------------------- log / factory


async def test_log_channel_does_not_raise() -> None:
    ch = LogChannel()
    await ch.send(_note())
    await ch.aclose()


async def test_build_channel() -> None:
    assert isinstance(build_channel("log"), LogChannel)
    smtp = build_channel("smtp", smtp_host="mail.local", smtp_port=2525)
    assert isinstance(smtp, SmtpChannel)
    assert (smtp.host, smtp.port) == ("mail.local", 2525)
    http = build_channel("http", http_url="http://127.0.0.1:1/sms")
    assert isinstance(http, HttpChannel)
    await http.aclose()
    with pytest.raises(ValueError, match="http_url"):
        build_channel("http")
    with pytest.raises(ValueError, match="unknown"):
        build_channel("pigeon")
