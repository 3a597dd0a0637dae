"""The request deadline (RESERVO_HTTP_REQUEST_DEADLINE_S): a request whose
response has not begun that many seconds after it arrived is answered 503
``unavailable`` (``Retry-After: 1``) at that moment, and its handler is cancelled.

Why: every database wait already has a bound (a pool slot within
RESERVO_DB_ACQUIRE_TIMEOUT_S, each statement within RESERVO_DB_COMMAND_TIMEOUT_S),
but a request makes several, and a group commit waits for its batch. Over a slow
or lossy network each statement stays under its bound while the request as a
whole takes many times it (seen in tests/chaos/test_partition.py: 200 ms each
way between the API and PostgreSQL made requests take up to 8.8 s against 2 s +
3 s of timeouts). A client's own timeout would then fire first and it could not
tell a slow answer from a dead server.

The answer goes out when the deadline passes, not when the handler has finished
unwinding: a cancelled statement's cleanup (asyncpg waits for the server to
confirm the cancellation, then rolls back) needs the network that is slow, and
runs on in the request's task while the client already has its 503. What the
handler sends afterwards is dropped. A write whose commit was under way may have
committed: the 503 says "unknown", and a retry under the same Idempotency-Key
gets its stored answer (docs/OPERATIONS.md, "Request deadline").

The time spent waiting for the client's body does not count (the slow-client
timeouts bound that, core/http/slow_clients.py), and once the response has begun
there is no deadline: a streamed export goes on as long as the client reads.

Cost: one timer per process, not per request. A timer armed and cancelled per
request (two for a request with a body) added 36 us to a bare ASGI call of 3 us
in a micro-benchmark on the loaded 2-core machine; here a request is an entry in
a set, 9 us, and one sweep every ``TICK_S`` (while any request is in flight)
answers the overdue ones: a deadline is kept to within a tick.
"""

from __future__ import annotations

import asyncio
import re
from collections.abc import Iterable

import orjson
import structlog
from prometheus_client import Counter
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from reservo.core.kernel.errors import PROBLEM_JSON, problem_body

log = structlog.get_logger(__name__)

DEADLINE_EXCEEDED = Counter(
    "reservo_http_deadline_exceeded_total",
    "Requests answered 503 because no response had begun within RESERVO_HTTP_REQUEST_DEADLINE_S",
)
_BODY = orjson.dumps(
    problem_body(503, "unavailable", "the request did not finish in time; try again shortly")
)
_HEADERS = [
    (b"content-type", PROBLEM_JSON.encode()),
    (b"content-length", str(len(_BODY)).encode()),
    (b"retry-after", b"1"),
]
TICK_S = 0.1


class _Request:
    """One request in flight: when its response must have begun (pushed back by
    the time it waits for the client's body), and what to answer then."""

    __slots__ = ("answer", "due", "expired", "path", "raw_send", "receiving", "started", "task")

    def __init__(self, due: float, send: Send, path: str) -> None:
        self.task = asyncio.current_task()
        self.due, self.raw_send, self.path = due, send, path
        self.started = self.expired = self.receiving = False
        self.answer: asyncio.Task[None] | None = None

    def expire(self, loop: asyncio.AbstractEventLoop) -> None:
        if self.task is None:
            return
        self.expired = True
        DEADLINE_EXCEEDED.inc()
        log.warning("request_deadline_exceeded", path=self.path)
        self.answer = loop.create_task(self._answer())
        self.task.cancel()

    async def settle(self) -> None:
        """After the expired handler returned: our cancel taken back, the 503 out."""
        assert self.task is not None and self.answer is not None
        self.task.uncancel()
        await self.answer

    async def _answer(self) -> None:
        await self.raw_send({"type": "http.response.start", "status": 503, "headers": _HEADERS})
        await self.raw_send({"type": "http.response.body", "body": _BODY})


class Deadlines:
    """The requests in flight in one process, and the sweep that answers the
    overdue ones 503 (``run`` wraps each request)."""

    def __init__(self, seconds: float, unbounded: Iterable[str] = ()) -> None:
        self.seconds = seconds
        self._unbounded = _matcher(unbounded)
        self.tick_s = min(TICK_S, seconds / 4)
        self._live: set[_Request] = set()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._sweep: asyncio.TimerHandle | None = None

    @classmethod
    def of(cls, seconds: float, unbounded: Iterable[str] = ()) -> Deadlines | None:
        """The deadlines of RESERVO_HTTP_REQUEST_DEADLINE_S; None for 0 (none).
        ``unbounded``: path templates ("/api/matches/{matchId}/void") left alone."""
        return cls(seconds, unbounded) if seconds > 0 else None

    def _track(self, request: _Request, loop: asyncio.AbstractEventLoop) -> None:
        if self._loop is not loop:  # requests left behind by a loop that stopped
            self._loop, self._live, self._sweep = loop, set(), None
        self._live.add(request)
        if self._sweep is None:
            self._sweep = loop.call_later(self.tick_s, self._sweep_once)

    def _sweep_once(self) -> None:
        assert self._loop is not None
        now = self._loop.time()
        overdue = [r for r in self._live if r.due <= now and not r.receiving]
        for request in overdue:
            self._live.discard(request)
            request.expire(self._loop)
        self._sweep = self._loop.call_later(self.tick_s, self._sweep_once) if self._live else None

    async def run(self, app: ASGIApp, scope: Scope, receive: Receive, send: Send) -> None:
        """``app`` on an HTTP request, answered 503 if it has not begun its
        response within ``seconds`` of the server's own time."""
        if self._unbounded is not None and self._unbounded.fullmatch(scope.get("path", "")):
            await app(scope, receive, send)
            return
        loop = asyncio.get_running_loop()
        request = _Request(loop.time() + self.seconds, send, str(scope.get("path", "")))
        self._track(request, loop)

        async def timed_receive() -> Message:
            if request.started or request.expired:
                return await receive()
            request.receiving, waited_from = True, loop.time()
            try:
                return await receive()
            finally:  # the client's time, not ours
                request.receiving = False
                request.due += loop.time() - waited_from

        async def tracked_send(message: Message) -> None:
            if request.expired:
                return  # the client has its 503
            if message["type"] == "http.response.start":
                request.started = True
                self._live.discard(request)
            await send(message)

        try:
            await app(scope, timed_receive, tracked_send)
        except (Exception, asyncio.CancelledError):
            # Past the deadline the handler unwinds from our cancel, as a CancelledError
            # or as whatever its cleanup turned it into: the request is over, not the
            # server, and the client has its answer.
            if not request.expired:
                raise
        finally:
            self._live.discard(request)
            if request.expired:
                await request.settle()


def _matcher(templates: Iterable[str]) -> re.Pattern[str] | None:
    """One pattern for path templates: a ``{param}`` matches one path segment."""
    parts = [re.sub(r"\\\{[^/]+?\\\}", "[^/]+", re.escape(template)) for template in templates]
    return re.compile("|".join(parts)) if parts else None


async def within_deadline(
    app: ASGIApp, seconds: float, scope: Scope, receive: Receive, send: Send
) -> None:
    """One request under a deadline of its own (``Deadlines(seconds).run``)."""
    await Deadlines(seconds).run(app, scope, receive, send)
