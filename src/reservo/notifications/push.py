"""Web Push: the channel that delivers a message to one browser subscription.

Delivery is RFC 8030 (a POST of the message to the subscription's endpoint, on
the push service that issued it), the payload encrypted for the browser per
RFC 8291 (``aes128gcm``, RFC 8188: ``http_ece`` does the ECDH, HKDF and AES-GCM
with the browser's P-256 key and auth secret), and the sender identified per
RFC 8292 (VAPID: a JWT signed with our key, made by ``py_vapid``). Each send
resolves the endpoint and checks every address against the egress rules of
``http`` jobs (subscriptions.py) before connecting to the checked one."""

from __future__ import annotations

import binascii
import re
import time

import http_ece
import httpx
import orjson
import structlog
from cryptography.hazmat.primitives.asymmetric import ec
from py_vapid import Vapid02, VapidException

from reservo.core.http import outbound
from reservo.core.messaging.notify import Notification
from reservo.notifications.errors import NotificationError
from reservo.notifications.subscriptions import PushSubscription, b64url_bytes
from reservo.scheduler import DestinationRefused, egress, resolve_destination

log = structlog.get_logger(__name__)

# RFC 8292: a token lives at most 24 hours; 12 leaves room for clock skew.
_TOKEN_S = 12 * 3600
_ERROR_BODY_MAX = 200
# The push service answers these when the subscription is no more (RFC 8030
# section 7.3; 404 from services that never knew it): the browser unsubscribed.
GONE_STATUSES = frozenset({404, 410})


class SubscriptionGone(Exception):
    """The push service says the subscription no longer exists (404 or 410)."""


def load_vapid(private_key: str) -> Vapid02:
    """The VAPID key as ``vapid --gen`` writes it (private_key.pem), or the raw
    32-byte scalar or DER, base64url. Raises ValueError at start-up."""
    try:
        text = private_key.strip()
        if text.startswith("-----BEGIN"):
            return Vapid02.from_pem(text.encode())
        return Vapid02.from_string(text)
    except (VapidException, ValueError, TypeError, binascii.Error) as exc:
        raise ValueError(
            f"RESERVO_PUSH_VAPID_PRIVATE_KEY is not a P-256 private key: {exc}"
        ) from exc


def origin(url: httpx.URL) -> str:
    """The audience of a VAPID token: the push service's origin (RFC 8292 2)."""
    default = {"https": 443, "http": 80}[url.scheme]
    port = "" if url.port in (None, default) else f":{url.port}"
    return f"{url.scheme}://{url.host}{port}"


class PushChannel:
    """Web Push to one subscription per send. The answer's 201 (or any 2xx) is
    acceptance by the push service; 404/410 raise ``SubscriptionGone`` (the caller
    deletes the subscription); anything else is a ``NotificationError`` to retry."""

    name = "push"

    def __init__(
        self,
        vapid_private_key: str,
        subject: str,
        allow: egress.AllowList,
        ttl_s: int = 86_400,
        timeout_s: float = 5.0,
        deadline_s: float = outbound.DEFAULT_DEADLINE_S,
    ) -> None:
        if not subject.startswith(("mailto:", "https://")):
            # RFC 8292 2.1: how the push service's operator reaches ours.
            raise ValueError("RESERVO_PUSH_VAPID_SUBJECT must be a mailto: or https: URI")
        self._vapid = load_vapid(vapid_private_key)
        self.subject = subject
        self.allow = allow
        self.ttl_s = ttl_s
        self.timeout_s = timeout_s
        self.limits = outbound.Limits(deadline_s, _ERROR_BODY_MAX * 4)
        # As the scheduler's http jobs: no proxy or netrc from the environment,
        # and no pooled connection (the checked address is in the URL; a pooled
        # TLS connection was verified for the host name that opened it).
        self._client = httpx.AsyncClient(
            timeout=timeout_s,
            follow_redirects=False,
            trust_env=False,
            limits=httpx.Limits(max_keepalive_connections=0),
        )

    def payload(self, n: Notification) -> bytes:
        """What the service worker receives (its ``push`` event's data, JSON)."""
        return orjson.dumps({"title": n.subject, "body": n.body, "eventId": n.event_id})

    def encrypt(self, data: bytes, sub: PushSubscription) -> bytes:
        """RFC 8291: a fresh ECDH key pair per message (its public key travels
        in the aes128gcm header), a random salt (http_ece makes one)."""
        ephemeral = ec.generate_private_key(ec.SECP256R1())
        body: bytes = http_ece.encrypt(
            data,
            private_key=ephemeral,
            dh=b64url_bytes(sub.p256dh),
            auth_secret=b64url_bytes(sub.auth),
            version="aes128gcm",
        )
        return body

    def authorization(self, endpoint: httpx.URL) -> str:
        claims = {"aud": origin(endpoint), "exp": int(time.time()) + _TOKEN_S, "sub": self.subject}
        header: str = self._vapid.sign(claims)["Authorization"]
        return header

    async def send(self, n: Notification, sub: PushSubscription) -> None:
        endpoint = httpx.URL(sub.endpoint)
        try:
            dest = await resolve_destination(self.allow, sub.endpoint, self.timeout_s)
        except DestinationRefused as exc:
            # The rules changed since the subscription was stored: retried, so
            # that an operator restoring the allowance loses no message.
            raise NotificationError(f"push to {_shown(endpoint)} refused: {exc}") from exc
        except Exception as exc:
            raise NotificationError(f"push to {_shown(endpoint)}: cannot resolve: {exc!r}") from exc
        headers = {
            "Host": dest.host_header,
            "TTL": str(self.ttl_s),
            "Content-Encoding": "aes128gcm",
            "Content-Type": "application/octet-stream",
            "Authorization": self.authorization(endpoint),
            # RFC 8030 5.4: a repeated send of one message replaces, not adds,
            # a copy the push service still holds (a retry after a lost answer).
            "Topic": _topic(n.event_id),
        }
        extensions = {"sni_hostname": dest.sni_hostname} if dest.sni_hostname else None
        try:
            answer = await outbound.call(
                self._client,
                "POST",
                dest.url,
                self.limits,
                content=self.encrypt(self.payload(n), sub),
                headers=headers,
                extensions=extensions,
            )
        except Exception as exc:  # connect, TLS, deadline, protocol
            raise NotificationError(
                f"push to {_shown(endpoint)} for event {n.event_id} failed: "
                f"{type(exc).__name__}: {exc}"
            ) from exc
        if answer.status_code in GONE_STATUSES:
            raise SubscriptionGone(f"{_shown(endpoint)} answered {answer.status_code}")
        if not answer.is_success:
            raise NotificationError(
                f"push to {_shown(endpoint)} for event {n.event_id} answered "
                f"{answer.status_code}: {answer.text(_ERROR_BODY_MAX)!r}"
            )
        log.debug("notification.sent", channel=self.name, event_id=n.event_id, to=_shown(endpoint))

    async def aclose(self) -> None:
        await self._client.aclose()


def _topic(event_id: str) -> str:
    # RFC 8030 5.4: at most 32 characters of the base64url alphabet.
    return re.sub(r"[^A-Za-z0-9_-]", "", event_id)[:32] or "reservo"


def _shown(url: httpx.URL) -> str:
    # For logs: the endpoint's path is the subscription's capability; the origin suffices.
    return origin(url) if url.scheme in ("http", "https") else "?"
