"""Web Push as the other side sees it: a browser (its subscription's ECDH key pair
and auth secret, which decrypt what it receives) and a push service of the
test's own on loopback, which records what it is sent and checks the sender's
VAPID token (RFC 8292) the way a real push service does."""

from __future__ import annotations

import asyncio
import base64
import os
import time
from dataclasses import dataclass, field
from typing import Any

import http_ece
import jwt
import orjson
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ec
from py_vapid import Vapid02

from tests.helpers.notify import Request, read_request

SUBJECT = "mailto:ops@clinic.example"


def b64url(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode()


def unb64url(text: str) -> bytes:
    return base64.urlsafe_b64decode(text + "=" * (-len(text) % 4))


class Browser:
    """What a browser's PushManager.subscribe() makes: a P-256 key pair and a
    16-byte auth secret; the push service never sees the private key."""

    def __init__(self) -> None:
        self.key = ec.generate_private_key(ec.SECP256R1())
        self.auth = os.urandom(16)

    @property
    def p256dh(self) -> str:
        return b64url(
            self.key.public_key().public_bytes(
                serialization.Encoding.X962, serialization.PublicFormat.UncompressedPoint
            )
        )

    def subscription(self, endpoint: str) -> dict[str, Any]:
        """PushSubscription.toJSON()."""
        return {
            "endpoint": endpoint,
            "expirationTime": None,
            "keys": {"p256dh": self.p256dh, "auth": b64url(self.auth)},
        }

    def decrypt(self, body: bytes) -> dict[str, Any]:
        """RFC 8291 aes128gcm, with this browser's private key and auth secret."""
        plain = http_ece.decrypt(
            body, private_key=self.key, auth_secret=self.auth, version="aes128gcm"
        )
        data: dict[str, Any] = orjson.loads(plain)
        return data


@dataclass
class VapidKeys:
    """The application server's key pair, as `vapid --gen` would write it."""

    private_pem: str
    public_raw: bytes

    @classmethod
    def generate(cls) -> VapidKeys:
        v = Vapid02()
        v.generate_keys()
        raw = v.public_key.public_bytes(
            serialization.Encoding.X962, serialization.PublicFormat.UncompressedPoint
        )
        return cls(v.private_pem().decode(), raw)


def verify_vapid(req: Request, keys: VapidKeys, origin: str, subject: str = SUBJECT) -> None:
    """What a push service checks (RFC 8292 section 2 and 3): the scheme, the
    public key it names (ours), the ES256 signature made with its private key,
    the audience (the push service's own origin), an expiry in the future and
    at most 24 hours away, and the subject."""
    scheme, _, params = req.headers["authorization"].partition(" ")
    assert scheme == "vapid", req.headers["authorization"]
    parts = dict(p.strip().split("=", 1) for p in params.split(","))
    assert unb64url(parts["k"]) == keys.public_raw
    public = ec.EllipticCurvePublicKey.from_encoded_point(ec.SECP256R1(), keys.public_raw)
    claims = jwt.decode(
        parts["t"],
        public,
        algorithms=["ES256"],
        audience=origin,
        options={"require": ["exp", "aud", "sub"]},
    )
    assert claims["sub"] == subject
    assert time.time() < claims["exp"] <= time.time() + 24 * 3600


@dataclass
class PushService:
    """Answers ``status`` (201 Created, as push services do) or the status set
    for one path (410: the subscription is gone)."""

    port: int = 0
    requests: list[Request] = field(default_factory=list)
    status: int = 201
    by_path: dict[str, int] = field(default_factory=dict)

    @property
    def origin(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def endpoint(self, name: str) -> str:
        return f"{self.origin}/push/{name}"

    def to(self, name: str) -> list[Request]:
        return [r for r in self.requests if r.path == f"/push/{name}"]

    async def handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            while (req := await read_request(reader)) is not None:
                self.requests.append(req)
                status = self.by_path.get(req.path, self.status)
                writer.write(f"HTTP/1.1 {status} X\r\nContent-Length: 0\r\n\r\n".encode())
                await writer.drain()
        except (ConnectionError, asyncio.IncompleteReadError):
            pass
        finally:
            writer.close()
