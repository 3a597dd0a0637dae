"""Built-in job handlers."""

from __future__ import annotations

import asyncio
import socket
from dataclasses import dataclass, replace
from typing import Any

import httpx
import structlog

from reservo.core.http import outbound
from reservo.core.kernel.errors import DomainError
from reservo.scheduler import egress
from reservo.scheduler.destinations import Busy, Destinations
from reservo.scheduler.domain import Job, JobDeferred, JobFailure

log = structlog.get_logger(__name__)

# What GET /api/jobs/{jobId} shows. One text for every way a call can fail
# (refused connection, timeout, unknown name, any non-2xx answer): telling them
# apart would let a caller map which hosts and ports exist behind us. The detail
# (JobFailure.detail) goes to the server log (the executor's scheduler_job_failed
# line) and to the execution log, neither of which the API renders.
POLICY_ERROR = "destination not allowed by RESERVO_JOBS_HTTP_ALLOW policy"
# A job whose destination already has its share of calls in flight waits for a
# slot while the destination answers: until SLOW_CALL_S pass without a call of
# it ending (scheduler/destinations.py). Then it is put back for BUSY_DELAY_S
# (not an attempt), so a slow destination's jobs do not hold executor slots.
SLOW_CALL_S = 0.5
BUSY_DELAY_S = 1.0


def call_failed(attempt: int) -> str:
    return f"http call failed: the destination did not answer 2xx (attempt {attempt})"


class DestinationRefused(Exception):
    """The URL or an address its host resolves to is outside the policy."""


@dataclass(frozen=True)
class Destination:
    """A checked destination: the URL to send to names the checked address, so
    the connection cannot go anywhere a second DNS answer would point to."""

    url: httpx.URL
    host_header: str
    sni_hostname: str | None
    shown: str  # the URL as the logs show it


def _shown(url: httpx.URL) -> str:
    # For logs: no query string (it may carry a token).
    return str(url.copy_with(query=None, fragment=None))


async def resolve_destination(allow: egress.AllowList, url: str, timeout_s: float) -> Destination:
    """Resolves the URL's host and checks every address it resolves to against
    ``allow`` (scheduler.egress). Raises DestinationRefused, or another error
    when it cannot resolve. Also used for Web Push endpoints (notifications):
    a URL a user stored is called from inside the network alike."""
    try:
        target = egress.parse_target(url)
    except ValueError as exc:
        raise DestinationRefused(str(exc)) from exc
    literal = egress.literal_address(target.host)
    if literal is not None:
        addresses = [literal]
    else:
        infos = await asyncio.wait_for(
            asyncio.get_running_loop().getaddrinfo(
                target.host, target.port, type=socket.SOCK_STREAM
            ),
            timeout_s,
        )
        found = [egress.literal_address(str(info[4][0])) for info in infos]
        addresses = list(dict.fromkeys(a for a in found if a is not None))
        if not addresses or None in found:  # nothing, or something we cannot check
            raise OSError(f"no usable address for {target.host}")
    if not allow.allows_host(target.host, target.port):
        # Every address: the connection may use any of them.
        for ip in addresses:
            why = egress.address_refusal(allow, ip, target.port)
            if why is not None:
                raise DestinationRefused(f"{target.host} resolves to {why}")
    return Destination(
        url=target.url.copy_with(host=str(egress.unmapped(addresses[0]))),
        host_header=target.url.netloc.decode("ascii"),
        sni_hostname=None if literal is not None else target.url.raw_host.decode("ascii"),
        shown=_shown(target.url),
    )


class HttpHandler:
    """Category ``http``: payload ``{url, method?, headers?, body?}``. Sends
    ``Idempotency-Key: <jobId>`` so the receiver can drop a repeated delivery.

    Destinations follow ``scheduler.egress`` (loopback, private, link-local and the
    like are refused unless ``allow`` lists them): checked when the job is
    created (URL only, no DNS) and when it runs (every resolved address).

    A call is bounded as a whole (``limits``: one deadline from the name lookup
    to the answer's head, and at most a prefix of the answer is read), and one
    destination (address and port) has at most ``per_destination`` calls in
    flight in this process: a slow destination's jobs cannot take every
    executor slot from the jobs of the others (the rest wait their turn while
    it answers, and are put back once it is slow: scheduler/destinations.py)."""

    def __init__(
        self,
        timeout_s: float = 10.0,
        allow: egress.AllowList | None = None,
        limits: outbound.Limits | None = None,
        per_destination: int = 8,
    ) -> None:
        self.timeout_s = timeout_s
        self.allow = allow or egress.AllowList()
        self.limits = limits or outbound.Limits()
        self.per_destination = per_destination
        self.destinations = Destinations(per_destination, SLOW_CALL_S)
        # trust_env=False: no proxy from the environment (a proxy, not us, would
        # pick the address to connect to) and no ~/.netrc credentials added.
        # No keep-alive: pooled connections are keyed by address, and a TLS one
        # was verified for the host name of the job that opened it.
        self.client = httpx.AsyncClient(
            timeout=timeout_s,
            follow_redirects=False,
            trust_env=False,
            limits=httpx.Limits(max_keepalive_connections=0),
        )

    def check(self, payload: dict[str, Any]) -> None:
        """At enqueue (POST /api/jobs): credentials in the URL, or a host written
        as an address the policy refuses, are 422. Host names are not resolved
        here; the call resolves and checks them."""
        reason = egress.static_refusal(self.allow, str(payload.get("url") or ""))
        if reason is not None:
            raise DomainError(
                "destination_not_allowed",
                f"payload.url is refused: {reason} (operators allow destinations "
                "with RESERVO_JOBS_HTTP_ALLOW)",
            )

    async def destination(self, url: str) -> Destination:
        """Resolves the URL's host and checks every address it resolves to.
        Raises DestinationRefused, or another error when it cannot resolve."""
        return await resolve_destination(self.allow, url, self.timeout_s)

    async def __call__(self, job: Job) -> None:
        p: dict[str, Any] = job.payload
        url = str(p.get("url") or "")
        public = call_failed(job.attempts)
        loop = asyncio.get_running_loop()
        end = loop.time() + self.limits.deadline_s
        try:
            async with asyncio.timeout_at(end):
                dest = await self.destination(url)
        except DestinationRefused as exc:
            log.warning("scheduler_http_refused", job_id=job.id, reason=str(exc))
            raise JobFailure(POLICY_ERROR, f"refused by policy: {exc}", permanent=True) from exc
        except Exception as exc:  # unknown name, resolver timeout: the same outside
            detail = f"{url.split('?', 1)[0]}: cannot resolve: {exc!r}"
            raise JobFailure(public, detail) from exc
        try:
            async with self.destinations.slot((dest.url.host, dest.url.port)):
                # What is left of the deadline after the name lookup.
                limits = replace(self.limits, deadline_s=max(end - loop.time(), 0.001))
                answer = await self._send(dest, p, job.id, limits)
        except Busy as exc:
            busy = f"{dest.shown}: {self.per_destination} calls in flight"
            raise JobDeferred(busy, BUSY_DELAY_S) from exc
        except Exception as exc:  # connect, TLS, deadline, protocol: all the same outside
            detail = f"{dest.shown} via {dest.url.host}: {exc!r}"
            raise JobFailure(public, detail) from exc
        if not answer.is_success:
            detail = f"{dest.shown} answered {answer.status_code}"
            raise JobFailure(public, detail)

    async def _send(
        self, dest: Destination, p: dict[str, Any], job_id: int, limits: outbound.Limits
    ) -> outbound.Answer:
        headers = {
            str(k): str(v) for k, v in (p.get("headers") or {}).items() if str(k).lower() != "host"
        }
        headers["Host"] = dest.host_header
        headers["Idempotency-Key"] = str(job_id)
        body = p.get("body")
        extensions = {"sni_hostname": dest.sni_hostname} if dest.sni_hostname else None
        return await outbound.call(
            self.client,
            str(p.get("method") or "POST").upper(),
            dest.url,
            limits,
            headers=headers,
            json=body if body is not None else None,
            extensions=extensions,
        )

    async def aclose(self) -> None:
        await self.client.aclose()
