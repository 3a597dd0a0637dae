"""Built-in job handlers."""

from __future__ import annotations

import asyncio
import socket
from dataclasses import dataclass
from typing import Any

import httpx
import structlog

from reservo.core import egress
from reservo.core.errors import DomainError
from reservo.scheduler.domain import Job, JobFailure

log = structlog.get_logger(__name__)

# What GET /api/jobs/{id} shows. One text for every way a call can fail
# (refused connection, timeout, unknown name, any non-2xx answer): telling them
# apart would let a caller map which hosts and ports exist behind us. The detail
# (JobFailure.detail) goes to the server log (the executor's scheduler_job_failed
# line) and to the execution log, neither of which the API renders.
POLICY_ERROR = "destination not allowed by RESERVO_JOBS_HTTP_ALLOW policy"


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


class HttpHandler:
    """Category ``http``: payload ``{url, method?, headers?, body?}``. Sends
    ``Idempotency-Key: <jobId>`` so the receiver can drop a repeated delivery.

    Destinations follow ``core.egress`` (loopback, private, link-local and the
    like are refused unless ``allow`` lists them): checked when the job is
    created (URL only, no DNS) and when it runs (every resolved address)."""

    def __init__(self, timeout_s: float = 10.0, allow: egress.AllowList | None = None) -> None:
        self.timeout_s = timeout_s
        self.allow = allow or egress.AllowList()
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
                self.timeout_s,
            )
            found = [egress.literal_address(str(info[4][0])) for info in infos]
            addresses = list(dict.fromkeys(a for a in found if a is not None))
            if not addresses or None in found:  # nothing, or something we cannot check
                raise OSError(f"no usable address for {target.host}")
        if not self.allow.allows_host(target.host):
            # Every address: the connection may use any of them.
            for ip in addresses:
                why = egress.address_refusal(self.allow, ip)
                if why is not None:
                    raise DestinationRefused(f"{target.host} resolves to {why}")
        return Destination(
            url=target.url.copy_with(host=str(egress.unmapped(addresses[0]))),
            host_header=target.url.netloc.decode("ascii"),
            sni_hostname=None if literal is not None else target.url.raw_host.decode("ascii"),
            shown=_shown(target.url),
        )

    async def __call__(self, job: Job) -> None:
        p: dict[str, Any] = job.payload
        url = str(p.get("url") or "")
        public = call_failed(job.attempts)
        try:
            dest = await self.destination(url)
        except DestinationRefused as exc:
            log.warning("scheduler_http_refused", job_id=job.id, reason=str(exc))
            raise JobFailure(POLICY_ERROR, f"refused by policy: {exc}", permanent=True) from exc
        except Exception as exc:  # unknown name, resolver timeout: the same outside
            detail = f"{url.split('?', 1)[0]}: cannot resolve: {exc!r}"
            raise JobFailure(public, detail) from exc
        headers = {
            str(k): str(v) for k, v in (p.get("headers") or {}).items() if str(k).lower() != "host"
        }
        headers["Host"] = dest.host_header
        headers["Idempotency-Key"] = str(job.id)
        body = p.get("body")
        extensions = {"sni_hostname": dest.sni_hostname} if dest.sni_hostname else None
        try:
            response = await self.client.request(
                str(p.get("method") or "POST").upper(),
                dest.url,
                headers=headers,
                json=body if body is not None else None,
                extensions=extensions,
            )
        except Exception as exc:  # connect, TLS, timeout, protocol: all the same outside
            detail = f"{dest.shown} via {dest.url.host}: {exc!r}"
            raise JobFailure(public, detail) from exc
        if not 200 <= response.status_code < 300:
            detail = f"{dest.shown} answered {response.status_code}"
            raise JobFailure(public, detail)

    async def aclose(self) -> None:
        await self.client.aclose()
