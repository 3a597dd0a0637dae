"""One delivery attempt over HTTP: the egress rules of ``http`` jobs, a bound
on the attempts in flight per endpoint, and a deadline.

The destination is checked the way an ``http`` job's is (the scheduler's
``HttpHandler.destination``: every address the host resolves to must be
allowed, and the call goes to the checked address). An endpoint that already
has ``per_endpoint`` attempts in flight in this process gets no more; as many
again may wait for a slot (so a fast endpoint's next attempt starts the moment
one ends), and beyond that the job is put back (``JobDeferred``, not an
attempt) after a jittered pause. A subscriber that never answers thus holds at
most twice ``per_endpoint`` executor slots, and the other endpoints'
deliveries keep the rest."""

from __future__ import annotations

import asyncio
import random
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass

import structlog

from reservo.core.http import outbound
from reservo.scheduler import DestinationRefused, HttpHandler, JobDeferred
from reservo.webhooks.domain import ERROR_TEXT_MAX, Outcome

log = structlog.get_logger(__name__)
# A busy endpoint's delivery is put back for a random pause in this range: the
# put-back ones come back spread out, refilling the waiting places as they free.
PAUSE_S = (0.25, 1.0)


@dataclass
class _Share:
    """One endpoint's attempts in flight and waiting for a place."""

    slots: asyncio.Semaphore
    waiting: int = 0


class Sender:
    def __init__(self, http: HttpHandler, timeout_s: float, per_endpoint: int) -> None:
        self.http, self.timeout_s, self.per_endpoint = http, timeout_s, per_endpoint
        self.limits = outbound.Limits(timeout_s, 4096)
        self._shares: dict[int, _Share] = {}

    @asynccontextmanager
    async def slot(self, endpoint_id: int) -> AsyncIterator[None]:
        """One of the endpoint's places for an attempt: the attempt (its reads
        included) runs inside. Raises JobDeferred when the endpoint has its
        share in flight and waiting, or when no place freed within the timeout."""
        share = self._shares.get(endpoint_id)
        if share is None:
            semaphore = asyncio.Semaphore(self.per_endpoint)
            share = self._shares[endpoint_id] = _Share(semaphore)
        if share.slots.locked() and share.waiting >= self.per_endpoint:
            busy = f"endpoint {endpoint_id}: its share is busy"
            raise JobDeferred(busy, _pause())
        await self._wait(endpoint_id, share)
        try:
            yield
        finally:
            share.slots.release()

    async def _wait(self, endpoint_id: int, share: _Share) -> None:
        """Waits for one of the endpoint's slots, at most the timeout."""
        share.waiting += 1
        try:
            async with asyncio.timeout(self.timeout_s):
                await share.slots.acquire()
        except TimeoutError:
            raise JobDeferred(f"endpoint {endpoint_id}: no slot freed", _pause()) from None
        finally:
            share.waiting -= 1

    async def send(self, url: str, headers: dict[str, str], body: bytes) -> Outcome:
        """POSTs ``body`` within the timeout; what came of it (never raises for
        the subscriber's doing)."""
        try:
            async with asyncio.timeout(self.timeout_s):
                return await self._send(url, headers, body)
        except TimeoutError:
            return Outcome(False, None, f"no answer within {self.timeout_s:g} s")

    async def _send(self, url: str, headers: dict[str, str], body: bytes) -> Outcome:
        try:
            dest = await self.http.destination(url)
        except DestinationRefused as exc:
            return Outcome(False, None, f"destination not allowed: {exc}"[:ERROR_TEXT_MAX])
        except Exception as exc:  # unknown name, resolver down
            return Outcome(False, None, f"cannot resolve: {exc!r}"[:ERROR_TEXT_MAX])
        extensions = {"sni_hostname": dest.sni_hostname} if dest.sni_hostname else None
        try:
            answer = await outbound.call(
                self.http.client,
                "POST",
                dest.url,
                self.limits,
                headers={**headers, "Host": dest.host_header},
                content=body,
                extensions=extensions,
            )
        except Exception as exc:  # refused, reset, TLS, deadline
            return Outcome(False, None, repr(exc)[:ERROR_TEXT_MAX])
        if answer.is_success:
            return Outcome(True, answer.status_code)
        return Outcome(False, answer.status_code, f"answered {answer.status_code}")


def _pause() -> float:
    return random.uniform(*PAUSE_S)
