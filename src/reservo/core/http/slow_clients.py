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

Every answer the server gives itself is problem+json, as the application's are:
a request the HTTP parser refuses (a header name with a control byte, a
Content-Length beside ``Transfer-Encoding: chunked``, a negative Content-Length)
is 400 ``bad_request`` with the parser's reason, a version other than HTTP/1.0
and HTTP/1.1 is 505 ``http_version_not_supported`` (uvicorn answered both as a
text/plain 400). Every answer given before the whole request arrived (these,
408, 431, and the application's 413 on a Content-Length past the limit) closes
with a lingering close (``_linger``), so a client still sending reads it whole.
A pipelined request refused while the answer before it is being made is
answered after that answer (``close_after_answer``).

Idle kept-alive connections are closed by uvicorn after ``keepalive_timeout_s``."""

from __future__ import annotations

import asyncio
import contextlib
import sys
from dataclasses import dataclass
from http import HTTPStatus
from typing import Any

import httptools
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


def _refusal(status: int, code: str, detail: str) -> tuple[bytes, bytes]:
    """The status line and headers (without the blank line: the server's default
    headers follow) and the body of a problem the server answers itself."""
    body = orjson.dumps(problem_body(status, code, detail))
    head = (
        f"HTTP/1.1 {status} {HTTPStatus(status).phrase}\r\n"
        f"content-type: {PROBLEM_JSON}\r\ncontent-length: {len(body)}\r\n"
        "connection: close\r\n"
    )
    return head.encode(), body


_TIMEOUT = _refusal(408, "request_timeout", "the request did not arrive in time")
_TOO_LARGE = _refusal(431, "headers_too_large", "the request line and headers are too large")
_VERSION = _refusal(
    505, "http_version_not_supported", "this server speaks HTTP/1.1 (and HTTP/1.0) only"
)
# The HTTP versions served; llhttp reads 0.9 and 2.0 too, and refuses any other
# DIGIT.DIGIT with this reason.
_SERVED_VERSIONS = frozenset(("1.0", "1.1"))
_UNKNOWN_VERSION = "Invalid HTTP version"


# An answered, half-closed connection is read and dropped until the client has
# been quiet this long (or closes it), and for the body timeout at the most.
LINGER_S = 1.0


class _Refused(Exception):
    """Raised from a parser callback once the request is answered: it stops the
    parser (httptools turns it into HttpParserCallbackError)."""


class _CycleTransport:
    """The transport as a request's cycle (uvicorn's RequestResponseCycle) sees
    it: it writes, asks whether the connection is closing, and closes it after
    an answer with ``Connection: close``. That close is the protocol's, which
    lingers when the client may still be sending (a 413 answered on the
    Content-Length, before the body).

    A response's head (status line and headers, one write) is held until the
    cycle's next write, its body, and goes out with it: one send and one TCP
    segment per small answer instead of two, for the server and the client
    alike. A head whose body does not follow in the same turn of the event loop
    (a streamed response still producing it) is written at the end of that
    turn, and a close writes it first: nothing waits on the body."""

    __slots__ = ("_held", "_loop", "_protocol", "_transport")

    def __init__(
        self,
        protocol: GuardedHttpToolsProtocol,
        transport: asyncio.Transport,
        loop: asyncio.AbstractEventLoop,
    ) -> None:
        self._protocol, self._transport, self._loop = protocol, transport, loop
        self._held: bytes | None = None

    def write(self, data: bytes) -> None:
        held = self._held
        if held is not None:
            self._held = None
            if len(data) <= _JOINED_MAX:
                self._transport.write(held + data)
            else:  # a large body is not copied to be joined
                self._transport.writelines((held, data))
        elif data.startswith(b"HTTP/"):
            self._held = data
            self._loop.call_soon(self._flush)
        else:
            self._transport.write(data)

    def _flush(self) -> None:
        held, self._held = self._held, None
        if held is not None and not self._transport.is_closing():
            self._transport.write(held)

    def is_closing(self) -> bool:
        return self._transport.is_closing()

    def close(self) -> None:
        self._flush()
        self._protocol.close_after_answer()


# A body up to this size is joined to its head in one buffer (a copy of both);
# a larger one is handed over beside it.
_JOINED_MAX = 64 * 1024


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
        self._may_overflow = False  # this read could have ended headers past the cap
        self._phase = _FRESH
        self._deadline = 0.0
        self._watchdog: asyncio.TimerHandle | None = None
        self._lingering = False
        self._heard = False  # bytes arrived while lingering, since the last check
        self._linger_until = 0.0
        self._cycle_transport: _CycleTransport | None = None
        # A refusal waiting for the answer before it (a pipelined request).
        self._deferred: tuple[bytes, bytes] | None = None

    # -- connection -------------------------------------------------------------------
    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        if len(self.connections) > self._max_connections:
            metrics.HTTP_CONNECTIONS_REFUSED.inc()
            transport.abort()
            return
        self._cycle_transport = _CycleTransport(self, transport, self.loop)
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
            self._heard = True  # answered and half-closed: what still comes is dropped
            return
        if self._phase == _IDLE:
            # Any byte between requests starts the next one's header clock, even
            # bytes that begin no message (a trickle of blank lines).
            self._begin_headers()
        elif self._phase == _FRESH:
            self._phase = _HEADERS  # the clock runs from the connection's opening
        self._may_overflow = self._header_bytes + len(data) > self._max_header_bytes
        # uvicorn's data_received, but for what it answers to a request the
        # parser refuses (a text/plain 400 and a plain close).
        self._unset_keepalive_if_required()
        try:
            self.parser.feed_data(data)
        except httptools.HttpParserUpgrade:
            self._unsupported_upgrade_warning()  # ws="none": no upgrade is served
        except httptools.HttpParserError as exc:
            if not self._lingering:  # else a callback answered already (_Refused)
                self._refuse_malformed(exc)
            return
        if self._phase == _HEADERS and not self.transport.is_closing():
            # httptools keeps a request line and headers in memory until they end
            # and sets no bound of its own: a fast client could grow them without
            # limit within the header timeout. (A read that also ended the headers
            # left this phase: counted bytes stay within one read of the cap.)
            self._header_bytes += len(data)
            if self._header_bytes > self._max_header_bytes:
                metrics.HTTP_SLOW_CLIENTS.labels(phase="header_size").inc()
                self._answer_and_close(*_TOO_LARGE)

    def _headers_too_large(self) -> bool:
        """The byte count in data_received sees only reads that leave the headers
        unfinished: a client writing 66 KiB of headers in one go ends them in the
        same read. Such a read (one that could have carried headers past the cap)
        has its headers counted as parsed, whatever the reads were; the count
        stays at or below the real size, so it never refuses early. Counted once
        the headers are complete, not per header: a callback per header line is
        a Python call each on every request."""
        if not self._may_overflow:
            return False
        # ": " and CRLF after each header line.
        parsed = len(self.url) + sum([len(name) + len(value) + 4 for name, value in self.headers])
        return parsed > self._max_header_bytes

    def on_message_begin(self) -> None:
        super().on_message_begin()
        if self._phase == _IDLE:  # pipelined: began in the same read as the last one
            self._begin_headers()

    def on_headers_complete(self) -> None:
        if self._headers_too_large():
            metrics.HTTP_SLOW_CLIENTS.labels(phase="header_size").inc()
            self._answer_and_close(*_TOO_LARGE)
            raise _Refused
        if self.parser.get_http_version() not in _SERVED_VERSIONS:
            self.logger.warning("Unsupported HTTP version received.")
            self._answer_and_close(*_VERSION)
            raise _Refused
        super().on_headers_complete()
        if self.cycle is not None:
            self.cycle.transport = self._cycle_transport  # type: ignore[assignment]
            if draining(self.app_state):
                self.cycle.keep_alive = False  # answered with Connection: close
        self._phase = _BODY
        self._header_bytes = 0
        self._deadline = self.loop.time() + self._body_timeout

    def on_message_complete(self) -> None:
        super().on_message_complete()
        self._phase = _IDLE

    def on_response_complete(self) -> None:
        if self._lingering:  # closing: no keep-alive timer, no pipelined request
            self.server_state.total_requests += 1
            return
        super().on_response_complete()

    def send_400_response(self, msg: str) -> None:
        """uvicorn's answer to a request it cannot read, as every other answer:
        problem+json, then a lingering close."""
        self._answer_and_close(*_refusal(400, "bad_request", msg))

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
        self._answer_and_close(*_TIMEOUT)

    def _refuse_malformed(self, exc: httptools.HttpParserError) -> None:
        """400 ``bad_request`` (llhttp's reason as the detail), or 505 for a
        well-formed version other than 1.0 and 1.1."""
        reason = str(exc)
        self.logger.warning("Invalid HTTP request received: %s", reason)
        if reason == _UNKNOWN_VERSION:
            self._answer_and_close(*_VERSION)
        elif isinstance(exc, httptools.HttpParserCallbackError):
            # Raised by uvicorn's own reading of the request (its URL, say).
            self.send_400_response("the request is not valid HTTP/1.1")
        else:
            self.send_400_response(f"the request is not valid HTTP/1.1: {reason}")

    def _answer_and_close(self, status_and_headers: bytes, body: bytes) -> None:
        cycle = self.cycle
        if cycle is not None and not cycle.response_complete:
            if self._phase != _BODY:
                # A pipelined request refused while the answer to the one before
                # it is being made: that answer goes out first, then this one
                # (close_after_answer); what the client sends meanwhile is dropped.
                self._deferred = (status_and_headers, body)
                cycle.keep_alive = False
                self._lingering = True
                if self._watchdog is not None:
                    self._watchdog.cancel()
                    self._watchdog = None
                return
            # This cycle's own request is refused (its body): whatever the app
            # still sends is dropped, and it reads http.disconnect.
            cycle.disconnected = True
            cycle.message_event.set()
            if cycle.response_started:  # part of its answer is out: nothing may follow
                self._linger()
                return
        self._write_refusal(status_and_headers, body)
        if self.transport.get_write_buffer_size():
            self.transport.abort()  # a client that does not read either: drop it
            return
        self._linger()

    def _write_refusal(self, status_and_headers: bytes, body: bytes) -> None:
        head = [status_and_headers]
        for name, value in self.server_state.default_headers:
            head.extend((name, b": ", value, b"\r\n"))
        head.extend((b"\r\n", body))
        self.transport.write(b"".join(head))

    def close_after_answer(self) -> None:
        """A cycle's close, once its answer is written (``Connection: close``):
        a lingering one while the client may still be sending the request (or
        the next one), else a plain one. A refusal deferred behind this answer
        is written first."""
        deferred, self._deferred = self._deferred, None
        if deferred is not None:
            if self.cycle is not None and self.cycle.response_complete:
                self._write_refusal(*deferred)
            self._linger()  # (an answer cut short is followed by nothing)
        elif self._lingering:
            pass  # answered by the server already: the linger closes it
        elif self._phase in (_HEADERS, _BODY) and not self.transport.is_closing():
            self._linger()
        else:
            self.transport.close()

    def _linger(self) -> None:
        # A lingering close: closing with the client's bytes still unread makes the
        # kernel send a reset, which can reach the client before the answer and
        # destroy it (a client still sending 50 KiB of headers never saw its 431,
        # one still sending a 20 MB body never saw its 413). So the answer is
        # followed by a FIN, what the client still sends is read and dropped, and
        # the connection closes when the client closes it, once it has been quiet
        # for LINGER_S, or after the body timeout at the most.
        # The linger's timer takes the watchdog's place: a deadline still pending
        # must not answer a second time, and connection_lost cancels either.
        self._lingering = True
        self.flow.resume_reading()  # paused while the app did not read the body
        if self.transport.can_write_eof():
            self.transport.write_eof()
        if self._watchdog is not None:
            self._watchdog.cancel()
        self._heard = False
        self._linger_until = self.loop.time() + self._body_timeout
        self._watchdog = self.loop.call_later(LINGER_S, self._linger_check)

    def _linger_check(self) -> None:
        if self._heard and self.loop.time() < self._linger_until:
            self._heard = False
            self._watchdog = self.loop.call_later(LINGER_S, self._linger_check)
        else:
            self._watchdog = None
            self.transport.close()
