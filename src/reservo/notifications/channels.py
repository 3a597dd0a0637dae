"""Notification delivery through the address channels: the log, e-mail, SMS.

Called by the notifications consumer outside any business transaction: a slow or
broken provider must never hold a database lock. Every failure surfaces as
``NotificationError`` so the caller has a single thing to catch and retry; the
outbox ``event_id`` travels with each message so retries can be de-duplicated
downstream.
"""

from __future__ import annotations

import asyncio
import re
from email.message import EmailMessage
from typing import Protocol

import aiosmtplib
import httpx
import structlog

from reservo.core.http import outbound
from reservo.core.kernel import tracing
from reservo.core.messaging.notify import Notification
from reservo.notifications.errors import NotificationError

log = structlog.get_logger(__name__)

# Characters allowed in the local part of our Message-ID; anything else in an
# event id is replaced so the header stays RFC 5322-valid.
_MSGID_UNSAFE = re.compile(r"[^A-Za-z0-9.!#$%&'*+/=?^_`{|}~-]")
_ERROR_BODY_MAX = 200


class Channel(Protocol):
    name: str

    async def send(self, n: Notification) -> None:
        """Deliver ``n`` or raise ``NotificationError`` so the caller retries."""
        ...

    async def aclose(self) -> None: ...


class LogChannel:
    """For development and tests: the caller already stores the notification
    in the database, so a log line is all the 'delivery' needed."""

    name = "log"

    async def send(self, n: Notification) -> None:
        log.info(
            "notification",
            channel=self.name,
            user_id=n.recipient_user_id,
            subject=n.subject,
            body=n.body,
            event_id=n.event_id,
        )

    async def aclose(self) -> None:
        """Nothing to release; present so every channel can be closed alike."""


class SmtpChannel:
    """E-mail through a real SMTP server. One connection per message: notifications
    are rare enough that a pooled connection would mostly be a stale one."""

    name = "smtp"

    def __init__(
        self,
        host: str,
        port: int,
        sender: str,
        email_template: str,
        username: str | None = None,
        password: str | None = None,
        starttls: bool = False,
        timeout_s: float = 5.0,
        deadline_s: float = outbound.DEFAULT_DEADLINE_S,
    ) -> None:
        try:
            email_template.format(user_id=0)
        except (KeyError, IndexError, ValueError) as exc:
            # Fail at start-up, not on the first notification hours later.
            raise ValueError(
                f"email_template must only use the {{user_id}} field: {email_template!r}"
            ) from exc
        self.host = host
        self.port = port
        self.sender = sender
        self.email_template = email_template
        self.username = username
        self.password = password
        self.starttls = starttls
        self.timeout_s = timeout_s
        # aiosmtplib's timeout is per command: a server trickling its replies
        # would hold the sender for as long as it likes without the deadline.
        self.deadline_s = deadline_s
        _, _, domain = sender.rpartition("@")
        self._msgid_domain = domain or "reservo.invalid"

    def build_message(self, n: Notification) -> EmailMessage:
        """Public so the exact wire message can be inspected in tests and logs."""
        msg = EmailMessage()
        msg["From"] = self.sender
        msg["To"] = n.email or self.email_template.format(user_id=n.recipient_user_id)
        msg["Subject"] = n.subject
        # A retry after a lost 250 reply resends the same event: an identical
        # Message-ID lets mail clients and humans spot the duplicate.
        local = _MSGID_UNSAFE.sub("_", n.event_id) or "empty"
        msg["Message-ID"] = f"<notify.{local}@{self._msgid_domain}>"
        msg["X-Reservo-Event-Id"] = n.event_id
        # The trace and request the message belongs to (core/kernel/tracing.py): a mail
        # system that traces, or a person reading the headers, can follow it back.
        for name, value in tracing.outgoing_headers().items():
            msg[name] = value
        msg.set_content(n.body)
        return msg

    async def send(self, n: Notification) -> None:
        msg = self.build_message(n)
        try:
            async with asyncio.timeout(self.deadline_s):
                refused, _ = await aiosmtplib.send(
                    msg,
                    hostname=self.host,
                    port=self.port,
                    username=self.username,
                    password=self.password,
                    # Explicit False: aiosmtplib's default would upgrade opportunistically.
                    start_tls=self.starttls,
                    timeout=self.timeout_s,
                )
        except TimeoutError as exc:  # before OSError, of which it is one
            raise NotificationError(
                f"smtp {self.host}:{self.port}: sending event {n.event_id} to {msg['To']} "
                f"did not finish within the {self.deadline_s:g} s deadline"
            ) from exc
        except (aiosmtplib.SMTPException, OSError) as exc:
            raise NotificationError(
                f"smtp {self.host}:{self.port}: sending event {n.event_id} to "
                f"{msg['To']} failed: {type(exc).__name__}: {exc}"
            ) from exc
        if refused:
            raise NotificationError(
                f"smtp {self.host}:{self.port}: recipient refused for event {n.event_id}: "
                + "; ".join(f"{rcpt}: {resp}" for rcpt, resp in refused.items())
            )
        log.debug("notification.sent", channel=self.name, event_id=n.event_id, to=msg["To"])

    async def aclose(self) -> None:
        """Nothing to release; present so every channel can be closed alike."""


class HttpChannel:
    """SMS through an HTTP provider. The Idempotency-Key header lets the provider
    drop a retry of a request whose response we lost."""

    name = "http"

    def __init__(
        self,
        url: str,
        token: str | None = None,
        timeout_s: float = 5.0,
        deadline_s: float = outbound.DEFAULT_DEADLINE_S,
    ) -> None:
        self.url = url
        # The whole call within the deadline; only an error text is read back.
        self.limits = outbound.Limits(deadline_s, _ERROR_BODY_MAX * 4)
        headers = {"Authorization": f"Bearer {token}"} if token else {}
        # One client for the channel's lifetime: reuses connections across sends.
        self._client = httpx.AsyncClient(headers=headers, timeout=timeout_s)

    async def send(self, n: Notification) -> None:
        payload: dict[str, object] = {
            "to": n.recipient_user_id,
            "subject": n.subject,
            "body": n.body,
            "eventId": n.event_id,
        }
        if n.phone is not None:  # the SMS goes to the user's own number
            payload["phone"] = n.phone
        try:
            resp = await outbound.call(
                self._client,
                "POST",
                self.url,
                self.limits,
                json=payload,
                headers={"Idempotency-Key": n.event_id},
            )
        except (httpx.HTTPError, httpx.InvalidURL) as exc:
            raise NotificationError(
                f"http POST {self.url} for event {n.event_id} failed: {type(exc).__name__}: {exc}"
            ) from exc
        if not resp.is_success:
            snippet = resp.text(_ERROR_BODY_MAX)
            raise NotificationError(
                f"http POST {self.url} for event {n.event_id} answered "
                f"{resp.status_code}: {snippet!r}"
            )
        log.debug("notification.sent", channel=self.name, event_id=n.event_id)

    async def aclose(self) -> None:
        await self._client.aclose()


def build_channel(
    kind: str,
    *,
    smtp_host: str = "127.0.0.1",
    smtp_port: int = 25,
    smtp_sender: str = "reservo@localhost",
    smtp_username: str | None = None,
    smtp_password: str | None = None,
    smtp_starttls: bool = False,
    email_template: str = "user-{user_id}@example.invalid",
    http_url: str | None = None,
    http_token: str | None = None,
    timeout_s: float = 5.0,
    deadline_s: float = outbound.DEFAULT_DEADLINE_S,
) -> LogChannel | SmtpChannel | HttpChannel:
    """Keyword names mirror the ``notify_*`` settings so wiring is a straight copy;
    a misconfiguration raises ``ValueError`` at start-up rather than at first send."""
    match kind:
        case "log":
            return LogChannel()
        case "smtp":
            return SmtpChannel(
                smtp_host,
                smtp_port,
                smtp_sender,
                email_template,
                username=smtp_username,
                password=smtp_password,
                starttls=smtp_starttls,
                timeout_s=timeout_s,
                deadline_s=deadline_s,
            )
        case "http":
            if not http_url:
                raise ValueError("notify channel 'http' needs http_url")
            return HttpChannel(
                http_url, token=http_token, timeout_s=timeout_s, deadline_s=deadline_s
            )
        case _:
            raise ValueError(f"unknown notify channel {kind!r} (expected log, smtp or http)")
