"""Payment-gateway adapters. The refund consumer only knows ``PaymentGateway``.

- ``SandboxGateway`` (only when chosen explicitly, e.g. `reservo up --demo`):
  records refunds in memory and serves a page that "pays" a hold by sending the
  signed webhook, so the whole flow runs without a real provider. Its links carry
  a per-booking token, so only whoever got the booking's paymentUrl can use them.
- ``HttpGateway``: POSTs refunds to a provider with an Idempotency-Key (the
  refund event id), retrying transient failures with backoff, behind a circuit
  breaker.

With no gateway configured there is none: no payment page, and refunds wait.
Neither is ever called inside a database transaction.
"""

from __future__ import annotations

import asyncio
import hashlib
import hmac
from dataclasses import dataclass, field
from typing import Protocol

import httpx
import orjson
import structlog
from tenacity import (
    AsyncRetrying,
    retry_if_exception_type,
    stop_after_attempt,
    wait_exponential_jitter,
)

from reservo.core.aio.breaker import CircuitBreaker
from reservo.core.http import outbound
from reservo.core.http.auth import sign_webhook
from reservo.core.messaging.failures import Rejected

log = structlog.get_logger(__name__)


@dataclass(frozen=True)
class WebhookKey:
    """What a payment webhook's signature is checked against: the shared secret,
    and how far from now its timestamp may be."""

    secret: str
    tolerance_s: int


class GatewayError(Exception):
    """The refund did not go through; the event is retried later by the relay."""


class RefundRefused(GatewayError, Rejected):
    """The gateway answered 4xx: it refuses this refund for good. Parked as a dead
    letter (replayable once the cause is fixed), never retried blindly."""


class TransientGatewayError(GatewayError):
    """Worth retrying right away (network error, 5xx, 429)."""


class PaymentGateway(Protocol):
    name: str

    async def refund(
        self, booking_id: int, amount: int, reference: str, subject: str = "bookingId"
    ) -> str:
        """Refund ``amount`` for ``booking_id``; ``reference`` is the idempotency key
        (the same reference twice refunds once). Returns the gateway's reference.
        ``subject``: what the id names (``appointmentId`` for a prepaid
        appointment's payment, taken by the same gateway)."""
        ...

    def payment_url(self, booking_id: int, subject: str = "bookingId") -> str | None:
        """Where the customer pays this booking (or appointment, by ``subject``), or
        None when this service knows no page."""
        ...

    async def aclose(self) -> None: ...


# Domain separation: the link key is derived from the webhook secret with this
# label, so a link token is never a valid X-Signature (and the reverse).
_LINK_LABEL = b"reservo/rentals/sandbox-payment-link/v1"


def link_token(webhook_secret: str, booking_id: int | str) -> str:
    """The token of the sandbox page's link for ``booking_id`` (128 bits, hex)."""
    key = hmac.new(webhook_secret.encode(), _LINK_LABEL, hashlib.sha256).digest()
    return hmac.new(key, str(booking_id).encode(), hashlib.sha256).hexdigest()[:32]


@dataclass
class SandboxRefund:
    booking_id: int
    amount: int
    reference: str
    subject: str = "bookingId"


@dataclass
class SandboxGateway:
    """Local stand-in for a provider. Refunds are kept (deduplicated by
    reference) and logged; ``checkout`` builds the signed webhook a provider
    would send after a successful payment. ``page_base`` is the public base URL
    of this API (its /sandbox/pay page)."""

    webhook_secret: str
    page_base: str = "http://127.0.0.1:8000"
    name: str = "sandbox"
    refunds: dict[str, SandboxRefund] = field(default_factory=dict)

    async def refund(
        self, booking_id: int, amount: int, reference: str, subject: str = "bookingId"
    ) -> str:
        if reference not in self.refunds:
            self.refunds[reference] = SandboxRefund(booking_id, amount, reference, subject)
            log.info(
                "sandbox_refund",
                booking_id=booking_id,
                subject=subject,
                amount=amount,
                reference=reference,
            )
        return f"sandbox-refund-{reference}"

    def link_token(self, booking_id: int, subject: str = "bookingId") -> str:
        # An appointment's link is keyed apart: a booking's token never opens the
        # page of the appointment with the same id.
        name = booking_id if subject == "bookingId" else f"{subject}:{booking_id}"
        return link_token(self.webhook_secret, name)

    def link_token_ok(self, booking_id: int, token: str | None, subject: str = "bookingId") -> bool:
        if not token:
            return False
        expected = self.link_token(booking_id, subject)
        return hmac.compare_digest(expected.encode(), token.encode())

    def payment_url(self, booking_id: int, subject: str = "bookingId") -> str | None:
        base = self.page_base.rstrip("/")
        page = "pay" if subject == "bookingId" else "pay-appointment"
        token = self.link_token(booking_id, subject)
        return f"{base}/sandbox/{page}/{booking_id}?token={token}"

    def checkout(
        self, booking_id: int, amount: int, t: int, subject: str = "bookingId"
    ) -> tuple[bytes, str]:
        """(raw body, X-Signature at Unix time ``t``) of a SUCCEEDED payment webhook.
        One booking (or appointment) is one sandbox transaction: a double submit
        is a redelivery the webhook answers ``duplicate``, never a second payment."""
        prefix = "sandbox" if subject == "bookingId" else "sandbox-appointment"
        body = orjson.dumps(
            {
                subject: booking_id,
                "providerTxnId": f"{prefix}-{booking_id}",
                "amount": amount,
                "status": "SUCCEEDED",
            }
        )
        return body, sign_webhook(self.webhook_secret, body, t)

    async def aclose(self) -> None:
        return None


class HttpGateway:
    name = "http"

    def __init__(
        self,
        base_url: str,
        token: str | None,
        timeout_s: float = 5.0,
        attempts: int = 3,
        client: httpx.AsyncClient | None = None,
        breaker: CircuitBreaker | None = None,
        deadline_s: float = outbound.DEFAULT_DEADLINE_S,
    ) -> None:
        # timeout_s is per network operation; the deadline bounds a whole refund
        # (every attempt), and each answer is read up to a bounded prefix.
        self._deadline_s = deadline_s
        self._limits = outbound.Limits(deadline_s)
        headers = {"Authorization": f"Bearer {token}"} if token else {}
        self._client = client or httpx.AsyncClient(
            base_url=base_url, timeout=timeout_s, headers=headers
        )
        self._attempts = attempts
        # After repeated transient failures, fail fast (BreakerOpen): the relay
        # retries the event later instead of every refund waiting on timeouts.
        self.breaker = breaker or CircuitBreaker(
            "rentals-gateway",
            failure_threshold=5,
            window_s=30,
            reset_timeout_s=15,
            counts_as_failure=lambda exc: isinstance(exc, TransientGatewayError),
        )

    async def _post(self, booking_id: int, amount: int, reference: str, subject: str) -> str:
        try:
            r = await outbound.call(
                self._client,
                "POST",
                "/refunds",
                self._limits,
                json={subject: booking_id, "amount": amount, "reference": reference},
                headers={"Idempotency-Key": reference},
            )
        except httpx.TransportError as exc:
            raise TransientGatewayError(repr(exc)) from exc
        if r.status_code >= 500 or r.status_code == 429:
            raise TransientGatewayError(f"gateway answered {r.status_code}")
        if r.status_code >= 400:
            raise RefundRefused(f"gateway refused the refund: {r.status_code} {r.text(200)}")
        try:
            body = orjson.loads(r.head)
            ref = body.get("id") if isinstance(body, dict) else None
        except orjson.JSONDecodeError:  # also a truncated answer: our reference will do
            ref = None
        return str(ref or reference)

    def payment_url(self, booking_id: int, subject: str = "bookingId") -> str | None:
        return None  # the provider's checkout link is not part of this integration

    async def refund(
        self, booking_id: int, amount: int, reference: str, subject: str = "bookingId"
    ) -> str:
        return await self.breaker.call(
            self._refund_with_retry, booking_id, amount, reference, subject
        )

    async def _refund_with_retry(
        self, booking_id: int, amount: int, reference: str, subject: str
    ) -> str:
        try:
            async with asyncio.timeout(self._deadline_s):
                return await self._attempts_of(booking_id, amount, reference, subject)
        except TimeoutError as exc:  # transient: counts for the breaker, the relay retries
            raise TransientGatewayError(
                f"the refund did not finish within the {self._deadline_s:g} s deadline"
            ) from exc

    async def _attempts_of(self, booking_id: int, amount: int, reference: str, subject: str) -> str:
        # Retries are safe: the provider dedupes by the Idempotency-Key.
        async for attempt in AsyncRetrying(
            stop=stop_after_attempt(self._attempts),
            wait=wait_exponential_jitter(multiplier=0.2, max=2.0),
            retry=retry_if_exception_type(TransientGatewayError),
            reraise=True,
        ):
            with attempt:
                return await self._post(booking_id, amount, reference, subject)
        raise AssertionError("unreachable")  # pragma: no cover

    async def aclose(self) -> None:
        await self._client.aclose()


def build_gateway(
    kind: str | None,
    webhook_secret: str,
    url: str | None,
    token: str | None,
    timeout_s: float,
    page_base: str,
    deadline_s: float = outbound.DEFAULT_DEADLINE_S,
) -> PaymentGateway | None:
    """None when no gateway was chosen: nothing is simulated by default."""
    if kind == "http":
        if not url:
            raise RuntimeError("RESERVO_RENTALS_GATEWAY_URL is required with the http gateway")
        return HttpGateway(url, token, timeout_s, deadline_s=deadline_s)
    if kind == "sandbox":
        return SandboxGateway(webhook_secret, page_base)
    return None
