"""The HTTP server's defence against slow clients, and the one place the uvicorn
server is configured (``reservo api`` and ``reservo up`` both serve with
``ServerConfig``).

uvicorn's httptools protocol has no read timeout of its own: a socket that sends
half a request line, headers without the final blank line, or a Content-Length and
then nothing is held until the client goes away, and it accepts every connection.
``GuardedHttpToolsProtocol`` adds, per connection, one watchdog timer (a single
``loop.call_later`` handle that re-arms itself; nothing is created per request):

* the headers of a request must arrive within ``header_timeout_s`` of its first
  byte (of the connection's opening, for the first request);
* its body within ``body_timeout_s`` of the end of the headers (a whole-body
  deadline: a client trickling one byte at a time cannot stretch it);
* past either, the client gets 408 ``request_timeout`` (problem+json) and the
  connection is closed. A connection that never sent a byte is closed silently;
* time the server itself is the one waiting (reading paused because the app has
  not asked for the body yet, a pipelined request queued behind a slow answer,
  ``Expect: 100-continue`` not answered yet, a response being written) never
  counts against the client: the deadline restarts once the server is ready;
* beyond ``max_connections`` open connections in the process, a new connection is
  closed at once, before anything is read: the descriptor is freed immediately and
  a load balancer or client retries elsewhere;
* while the process drains before stopping (core/http/graceful.py), every answer closes
  its connection, so no kept-alive connection is left idle to be cut at the stop.

Idle kept-alive connections are closed by uvicorn after ``keepalive_timeout_s``."""

from __future__ import annotations

import asyncio
import contextlib
import sys
from dataclasses import dataclass
from typing import Any

import orjson
import uvicorn
from uvicorn.config import STARTUP_FAILURE
from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol
from uvicorn.server import ServerState
from uvicorn.supervisors import Multiprocess

from reservo.core.http.graceful import draining
from reservo.core.kernel import metrics
from reservo.core.kernel.errors import PROBLEM_JSON, problem_body


@dataclass(frozen=True, slots=True)
class HttpLimits:
    header_timeout_s: float = 15.0
    body_timeout_s: float = 15.0
    keepalive_timeout_s: int = 5
    max_connections: int = 1024
    max_header_bytes: int = 65_536


class ServerConfig(uvicorn.Config):
    """uvicorn's Config carrying the limits: uvicorn hands its config to every
    protocol it creates, and pickles it to the processes of ``--workers N``, so the
    limits travel with it (a class built around them could not be pickled)."""

    def __init__(self, app: Any, limits: HttpLimits, **kwargs: Any) -> None:
        super().__init__(
            app,
            http=GuardedHttpToolsProtocol,
            # No route speaks WebSocket; an upgrade would also outlive the watchdog.
            ws="none",
            timeout_keep_alive=limits.keepalive_timeout_s,
            log_config=None,
            access_log=False,
            **kwargs,
        )
        self.limits = limits


def serve(config: ServerConfig) -> None:
    """Run the server in this process, or under uvicorn's supervisor with
    ``config.workers`` processes sharing one socket (what ``uvicorn.run`` does)."""
    server = uvicorn.Server(config)
    with contextlib.suppress(KeyboardInterrupt):
        if config.workers > 1:
            _Supervisor(config, sockets=[config.bind_socket()]).run()
        else:
            server.run()
    if config.workers == 1 and not server.started:
        sys.exit(STARTUP_FAILURE)  # e.g. the port is taken (uvicorn logged why)


class _Supervisor(Multiprocess):
    """uvicorn's supervisor of ``--workers N``. It closes its own copy of the
    listening socket before it stops the workers, so the port closes when the last
    worker stops accepting (after its drain), not when the supervisor exits after
    them: connections queued on the socket meanwhile would be reset unanswered."""

    def terminate_all(self) -> None:
        for sock in self.sockets:
            sock.close()
        super().terminate_all()


# What the watchdog measures: the first request not begun yet (no byte seen),
# headers arriving, a body arriving, nothing being read (between requests, or the
# app answering: not the client's time).
_FRESH, _HEADERS, _BODY, _IDLE = range(4)

_TIMEOUT_BODY = orjson.dumps(
    problem_body(408, "request_timeout", "the request did not arrive in time")
)
_TIMEOUT_HEAD = (
    b"HTTP/1.1 408 Request Timeout\r\n"
    + f"content-type: {PROBLEM_JSON}\r\ncontent-length: {len(_TIMEOUT_BODY)}\r\n".encode()
    + b"connection: close\r\n"
)
_TOO_LARGE_BODY = orjson.dumps(
    problem_body(431, "headers_too_large", "the request line and headers are too large")
)
_TOO_LARGE_HEAD = (
    b"HTTP/1.1 431 Request Header Fields Too Large\r\n"
    + f"content-type: {PROBLEM_JSON}\r\ncontent-length: {len(_TOO_LARGE_BODY)}\r\n".encode()
    + b"connection: close\r\n"
)


# How long an answered, half-closed connection may still be read and dropped.
LINGER_S = 1.0


class GuardedHttpToolsProtocol(HttpToolsProtocol):
    """uvicorn's httptools protocol with header and body deadlines and a cap on
    open connections (see the module's docstring)."""

    def __init__(
        self,
        config: uvicorn.Config,
        server_state: ServerState,
        app_state: dict[str, Any],
        _loop: asyncio.AbstractEventLoop | None = None,
    ) -> None:
        super().__init__(config, server_state, app_state, _loop)
        limits: HttpLimits = getattr(config, "limits", None) or HttpLimits()
        self._header_timeout = limits.header_timeout_s
        self._body_timeout = limits.body_timeout_s
        self._max_connections = limits.max_connections
        self._max_header_bytes = limits.max_header_bytes
        self._header_bytes = 0
        self._phase = _FRESH
        self._deadline = 0.0
        self._watchdog: asyncio.TimerHandle | None = None
        self._lingering = False

    # -- connection -------------------------------------------------------------------
    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        if len(self.connections) > self._max_connections:
            metrics.HTTP_CONNECTIONS_REFUSED.inc()
            transport.abort()
            return
        self._deadline = self.loop.time() + self._header_timeout
        self._watchdog = self.loop.call_later(self._header_timeout, self._check)

    def connection_lost(self, exc: Exception | None) -> None:
        if self._watchdog is not None:
            self._watchdog.cancel()
            self._watchdog = None
        super().connection_lost(exc)

    # -- what the parser reports ------------------------------------------------------
    def data_received(self, data: bytes) -> None:
        if self._lingering:
            return  # answered and half-closed: what the client still sends is dropped
        if self._phase == _IDLE:
            # Any byte between requests starts the next one's header clock, even
            # bytes that begin no message (a trickle of blank lines).
            self._begin_headers()
        elif self._phase == _FRESH:
            self._phase = _HEADERS  # the clock runs from the connection's opening
        super().data_received(data)
        if self._phase == _HEADERS and not self.transport.is_closing():
            # httptools keeps a request line and headers in memory until they end
            # and sets no bound of its own: a fast client could grow them without
            # limit within the header timeout. (A read that also ended the headers
            # left this phase: counted bytes stay within one read of the cap.)
            self._header_bytes += len(data)
            if self._header_bytes > self._max_header_bytes:
                metrics.HTTP_SLOW_CLIENTS.labels(phase="header_size").inc()
                self._answer_and_close(_TOO_LARGE_HEAD, _TOO_LARGE_BODY)

    def on_message_begin(self) -> None:
        super().on_message_begin()
        if self._phase == _IDLE:  # pipelined: began in the same read as the last one
            self._begin_headers()

    def on_headers_complete(self) -> None:
        super().on_headers_complete()
        if self.cycle is not None and draining(self.app_state):
            self.cycle.keep_alive = False  # answered with Connection: close
        self._phase = _BODY
        self._header_bytes = 0
        self._deadline = self.loop.time() + self._body_timeout

    def on_message_complete(self) -> None:
        super().on_message_complete()
        self._phase = _IDLE

    def _begin_headers(self) -> None:
        self._phase = _HEADERS
        self._header_bytes = 0
        self._deadline = self.loop.time() + self._header_timeout

    # -- the watchdog -----------------------------------------------------------------
    def _check(self) -> None:
        self._watchdog = None
        if self.transport.is_closing():
            return
        now = self.loop.time()
        if self._phase == _IDLE:
            delay = self._header_timeout
        elif now < self._deadline:
            delay = self._deadline - now
        elif self._server_is_waiting():
            delay = self._body_timeout if self._phase == _BODY else self._header_timeout
            self._deadline = now + delay
        else:
            self._expire()
            return
        self._watchdog = self.loop.call_later(delay, self._check)

    def _server_is_waiting(self) -> bool:
        """True when the request is late because of the server, not the client."""
        if self.pipeline or self.flow.read_paused:
            return True
        cycle = self.cycle
        if cycle is None:
            return False
        if self._phase == _HEADERS:
            return not cycle.response_complete  # the previous answer is still going
        # The body is late: the client may wait for "100 Continue", or the app has
        # answered early and is still writing.
        return cycle.waiting_for_100_continue or (
            cycle.response_started and not cycle.response_complete
        )

    def _expire(self) -> None:
        phase, cycle = self._phase, self.cycle
        if phase == _FRESH:
            metrics.HTTP_SLOW_CLIENTS.labels(phase="idle").inc()
            self.transport.close()  # never sent a byte: nothing to answer
            return
        metrics.HTTP_SLOW_CLIENTS.labels(phase="headers" if phase == _HEADERS else "body").inc()
        if phase == _BODY and cycle is not None:
            # The app may be waiting in receive(): it now gets http.disconnect, and
            # whatever it sends is dropped (the 408 below is the answer).
            cycle.disconnected = True
            cycle.message_event.set()
            if cycle.response_started:  # answered already (without reading the body)
                self.transport.close()
                return
        self._answer_and_close(_TIMEOUT_HEAD, _TIMEOUT_BODY)

    def _answer_and_close(self, status_and_headers: bytes, body: bytes) -> None:
        head = [status_and_headers]
        for name, value in self.server_state.default_headers:
            head.extend((name, b": ", value, b"\r\n"))
        head.extend((b"\r\n", body))
        self.transport.write(b"".join(head))
        if self.transport.get_write_buffer_size():
            self.transport.abort()  # a client that does not read either: drop it
            return
        # A lingering close: closing with the client's bytes still unread makes the
        # kernel send a reset, which can reach the client before the answer and
        # destroy it (a client still sending 50 KiB of headers never saw its 431).
        # So the answer is followed by a FIN, what the client still sends is read
        # and dropped, and the connection closes when the client closes it, or
        # after LINGER_S at the most.
        # The linger's timer takes the watchdog's place: a deadline still pending
        # must not answer a second time, and connection_lost cancels either.
        self._lingering = True
        if self.transport.can_write_eof():
            self.transport.write_eof()
        if self._watchdog is not None:
            self._watchdog.cancel()
        self._watchdog = self.loop.call_later(LINGER_S, self.transport.close)
