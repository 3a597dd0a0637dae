"""Destinations the notification tests deliver to: an SMTP server and an HTTP endpoint."""

from __future__ import annotations

import asyncio
import email
import email.policy
from dataclasses import dataclass, field
from email.message import EmailMessage
from typing import Any

TEMPLATE = "user-{user_id}@example.invalid"


@dataclass
class SmtpSink:
    port: int
    collector: Collector
    logins: list[str] = field(default_factory=list)


@dataclass
class HttpSink:
    url: str
    requests: list[Request] = field(default_factory=list)
    status: int = 200
    hang: bool = False
    release: asyncio.Event = field(default_factory=asyncio.Event)


class Collector:
    def __init__(self) -> None:
        self.messages: list[tuple[str, list[str], EmailMessage]] = []

    async def handle_DATA(self, server: Any, session: Any, envelope: Any) -> str:
        msg = email.message_from_bytes(envelope.content, policy=email.policy.default)
        assert isinstance(msg, EmailMessage)
        self.messages.append((envelope.mail_from, list(envelope.rcpt_tos), msg))
        return "250 OK"


@dataclass
class Request:
    method: str
    path: str
    headers: dict[str, str]
    body: bytes


async def read_request(reader: asyncio.StreamReader) -> Request | None:
    line = await reader.readline()
    if not line:
        return None
    method, path, _ = line.decode("latin-1").split(" ", 2)
    headers: dict[str, str] = {}
    while (raw := await reader.readline()) not in (b"\r\n", b"\n", b""):
        name, _, value = raw.decode("latin-1").partition(":")
        headers[name.strip().lower()] = value.strip()
    body = await reader.readexactly(int(headers.get("content-length", "0")))
    return Request(method, path, headers, body)
