"""Notification channels against real local servers (aiosmtpd, a raw asyncio HTTP server)."""

from __future__ import annotations

import json

import pytest
from structlog.testing import capture_logs

from reservo.core.messaging.notify import Notification
from reservo.notifications.channels import (
    HttpChannel,
    LogChannel,
    NotificationError,
    SmtpChannel,
    build_channel,
)
from tests.helpers.notify import TEMPLATE, HttpSink, SmtpSink
from tests.helpers.procs import free_port


def _note(event_id: str = "evt-42") -> Notification:
    return Notification(
        recipient_user_id=7,
        subject="Your booking is confirmed — 10:00",
        body="See you tomorrow.\nRoom 3.",
        event_id=event_id,
    )


# --------------------------------------------------------------------------- SMTP


async def test_smtp_delivers_message(smtp_server: SmtpSink) -> None:
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


async def test_smtp_resend_keeps_message_id(smtp_server: SmtpSink) -> None:
    ch = SmtpChannel("127.0.0.1", smtp_server.port, "reservo@example.invalid", TEMPLATE)
    await ch.send(_note("evt 9 <x>"))
    await ch.send(_note("evt 9 <x>"))

    ids = [m["Message-ID"] for _, _, m in smtp_server.collector.messages]
    assert len(ids) == 2
    assert ids[0] == ids[1]
    assert " " not in ids[0] and ids[0].count("<") == 1
    assert smtp_server.collector.messages[0][2]["X-Reservo-Event-Id"] == "evt 9 <x>"


async def test_smtp_login(smtp_server: SmtpSink) -> None:
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


async def test_smtp_bad_password_raises(smtp_server: SmtpSink) -> None:
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
    port = free_port()
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


async def test_http_posts_json_with_idempotency_key(http_server: HttpSink) -> None:
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


async def test_http_without_token_sends_no_authorization(http_server: HttpSink) -> None:
    ch = HttpChannel(http_server.url)
    try:
        await ch.send(_note())
    finally:
        await ch.aclose()
    assert "authorization" not in http_server.requests[0].headers


async def test_http_500_raises(http_server: HttpSink) -> None:
    http_server.status = 500
    ch = HttpChannel(http_server.url)
    try:
        with pytest.raises(NotificationError, match=r"500: 'provider exploded'"):
            await ch.send(_note())
    finally:
        await ch.aclose()
    assert len(http_server.requests) == 1


async def test_http_non_2xx_raises(http_server: HttpSink) -> None:
    http_server.status = 302
    ch = HttpChannel(http_server.url)
    try:
        with pytest.raises(NotificationError, match="302"):
            await ch.send(_note())
    finally:
        await ch.aclose()


async def test_http_timeout_raises(http_server: HttpSink) -> None:
    http_server.hang = True
    ch = HttpChannel(http_server.url, timeout_s=0.3)
    try:
        with pytest.raises(NotificationError, match="Timeout"):
            await ch.send(_note())
    finally:
        await ch.aclose()


async def test_http_server_down_raises() -> None:
    ch = HttpChannel(f"http://127.0.0.1:{free_port()}/sms", timeout_s=2.0)
    try:
        with pytest.raises(NotificationError, match="ConnectError") as info:
            await ch.send(_note())
    finally:
        await ch.aclose()
    assert info.value.__cause__ is not None


# --------------------------------------------------------------------------- log / factory


async def test_the_log_channel_logs_the_notification() -> None:
    ch = LogChannel()
    with capture_logs() as logs:
        await ch.send(_note())
    await ch.aclose()
    note = _note()
    assert [
        (e["event"], e["channel"], e["user_id"], e["subject"], e["body"], e["event_id"])
        for e in logs
    ] == [("notification", "log", 7, note.subject, note.body, "evt-42")]


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
