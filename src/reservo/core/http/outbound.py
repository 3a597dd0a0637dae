"""Bounded outbound HTTP calls: a whole-call deadline and a bounded answer.

httpx's ``timeout`` applies to each network operation (connect, one read, one
write), so a destination that trickles one byte a second never trips it and
holds the caller for as long as it likes; and ``response.content`` reads the
whole body into memory, however large. Every outbound HTTP call of the service
goes through ``call``: the deadline covers the whole exchange (connect, send,
the answer's head), and at most ``max_bytes`` of the body are read; the rest is
never read (the connection is closed instead).
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass
from typing import Any

import httpx

from reservo.core.kernel import tracing

# What the service keeps of an answer it only inspects (an error text, a JSON
# reference): far more than either needs.
DEFAULT_MAX_RESPONSE_BYTES = 64 * 1024
DEFAULT_DEADLINE_S = 30.0


class DeadlineExceeded(httpx.TimeoutException):
    """The whole call took longer than its deadline. An httpx timeout, so every
    caller that already treats timeouts as transient does so for this one."""


@dataclass(frozen=True)
class Limits:
    deadline_s: float = DEFAULT_DEADLINE_S
    max_response_bytes: int = DEFAULT_MAX_RESPONSE_BYTES


@dataclass(frozen=True)
class Answer:
    """The status and at most ``max_response_bytes`` of the body."""

    status_code: int
    head: bytes
    truncated: bool

    @property
    def is_success(self) -> bool:
        return 200 <= self.status_code < 300

    def text(self, limit: int) -> str:
        return self.head[:limit].decode("utf-8", "replace")


async def call(
    client: httpx.AsyncClient,
    method: str,
    url: httpx.URL | str,
    limits: Limits,
    **kwargs: Any,
) -> Answer:
    """Sends the request and reads the answer's head within ``limits``. Raises
    DeadlineExceeded past the deadline, httpx errors as usual otherwise. The call
    is a client span of the current trace (a new trace outside any), and carries
    its ``traceparent`` and the current ``X-Request-ID``."""
    target = httpx.URL(url)
    with tracing.span(
        method,
        "client",
        attributes={
            "http.request.method": method,
            "server.address": target.host,
            "server.port": target.port or (443 if target.scheme == "https" else 80),
        },
    ) as span:
        headers = httpx.Headers(kwargs.pop("headers", None))
        headers.update(tracing.outgoing_headers())
        try:
            async with asyncio.timeout(limits.deadline_s):
                answer = await _exchange(
                    client, method, url, limits.max_response_bytes, headers=headers, **kwargs
                )
        except TimeoutError as exc:
            raise DeadlineExceeded(
                f"no complete answer within the deadline ({limits.deadline_s:.1f} s)"
            ) from exc
        span.set("http.response.status_code", answer.status_code)
        return answer


async def _exchange(
    client: httpx.AsyncClient, method: str, url: httpx.URL | str, max_bytes: int, **kwargs: Any
) -> Answer:
    headers = httpx.Headers(kwargs.pop("headers", None))
    # Raw bytes are what is counted: a compressed answer could expand a small
    # read into a large decoded chunk, so ask for none.
    headers["Accept-Encoding"] = "identity"
    async with client.stream(method, url, headers=headers, **kwargs) as response:
        head = bytearray()
        async for chunk in response.aiter_raw():
            head += chunk
            if len(head) >= max_bytes:
                # Leaving the block closes the response (and its connection)
                # without reading what is left.
                return Answer(response.status_code, bytes(head[:max_bytes]), True)
        return Answer(response.status_code, bytes(head), False)
