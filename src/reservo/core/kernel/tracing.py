"""Traces and request ids, end to end.

Every request gets a W3C trace context (its ``traceparent``, or a new trace) and
a request id (its ``X-Request-ID``, or a new one), both held in context
variables for as long as the request runs. The outbox stores them with each
event the request emits; the transports hand them to the consumers (a Kafka
record's headers, the local transport's event), whose handling runs in the
event's trace and under its request id; outbound calls carry them as headers.
Every log line carries ``request_id``, ``trace_id`` and ``span_id`` when they
are set (``add_trace_ids``, a structlog processor).

Two ways to run, chosen once per process (``setup``):

- no exporter configured (the default): only ids. A span is a new span id in a
  context variable; nothing is recorded, nothing is sent. A few microseconds per
  request.
- an exporter configured by the standard ``OTEL_*`` variables: the same calls
  also start OpenTelemetry spans (server, producer, consumer, client), exported
  over OTLP/HTTP in batches, sampled as ``OTEL_TRACES_SAMPLER`` says. The SDK is
  imported only then.
"""

from __future__ import annotations

import re
import time
from collections.abc import Iterator, Mapping, MutableMapping
from contextlib import contextmanager
from contextvars import ContextVar, Token
from dataclasses import dataclass
from random import getrandbits
from typing import Any, Protocol

import structlog
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from reservo.core.kernel.access_log import AccessLog

log = structlog.get_logger(__name__)

# version-traceid-parentid-flags (W3C Trace Context, level 1). A later version
# may append fields: its first four are read the same way.
_TRACEPARENT = re.compile(
    r"([0-9a-f]{2})-([0-9a-f]{32})-([0-9a-f]{16})-([0-9a-f]{2})(-[^\s]*)?", re.ASCII
)
_ZERO_TRACE, _ZERO_SPAN = "0" * 32, "0" * 16

# A request id a caller may send: what proxies and clients make (UUIDs, hex,
# base64, dotted or colon-separated ids), nothing a log line or header could be
# broken with, and short enough to sit on every log line.
REQUEST_ID_MAX = 128
_REQUEST_ID = re.compile(rb"[A-Za-z0-9._:+/=@-]{1,%d}" % REQUEST_ID_MAX, re.ASCII)


@dataclass(frozen=True, slots=True)
class TraceContext:
    """Where work is in a trace: the trace, the current span, whether sampled."""

    trace_id: str  # 32 lower-case hex digits
    span_id: str  # 16 lower-case hex digits
    sampled: bool = False

    @property
    def traceparent(self) -> str:
        return f"00-{self.trace_id}-{self.span_id}-{'01' if self.sampled else '00'}"


def parse_traceparent(value: str | bytes | None) -> TraceContext | None:
    """The context a ``traceparent`` header names, or None when it is absent or
    invalid (the standard says to start a new trace then, not to refuse)."""
    if value is None:
        return None
    if isinstance(value, bytes):
        value = value.decode("latin-1")
    m = _TRACEPARENT.fullmatch(value.strip())
    if m is None:
        return None
    version, trace_id, span_id, flags, rest = m.groups()
    if version == "ff" or (version == "00" and rest) or trace_id == _ZERO_TRACE:
        return None
    if span_id == _ZERO_SPAN:
        return None
    return TraceContext(trace_id, span_id, bool(int(flags, 16) & 1))


def valid_request_id(value: bytes) -> bool:
    return _REQUEST_ID.fullmatch(value) is not None


def new_request_id() -> str:
    return f"{getrandbits(128):032x}"


def _new_trace_id() -> str:
    return f"{getrandbits(128) or 1:032x}"


def _new_span_id() -> str:
    return f"{getrandbits(64) or 1:016x}"


_CONTEXT: ContextVar[TraceContext | None] = ContextVar("reservo_trace", default=None)
_REQUEST: ContextVar[str | None] = ContextVar("reservo_request_id", default=None)


def current() -> TraceContext | None:
    return _CONTEXT.get()


def current_traceparent() -> str | None:
    ctx = _CONTEXT.get()
    return None if ctx is None else ctx.traceparent


def current_request_id() -> str | None:
    return _REQUEST.get()


def add_trace_ids(_: Any, __: str, event: MutableMapping[str, Any]) -> MutableMapping[str, Any]:
    """structlog processor: the request id and trace ids of the work in progress."""
    rid = _REQUEST.get()
    if rid is not None:
        event.setdefault("request_id", rid)
    ctx = _CONTEXT.get()
    if ctx is not None:
        event.setdefault("trace_id", ctx.trace_id)
        event.setdefault("span_id", ctx.span_id)
    return event


# -- spans ------------------------------------------------------------------------------


class _Otel:
    """The OpenTelemetry side, present only when an exporter is configured."""

    def __init__(self, provider: Any) -> None:
        from opentelemetry import trace
        from opentelemetry.trace import SpanKind, Status, StatusCode

        self.provider = provider
        self.tracer = provider.get_tracer("reservo")
        self.trace = trace
        self.kinds = {
            "server": SpanKind.SERVER,
            "client": SpanKind.CLIENT,
            "producer": SpanKind.PRODUCER,
            "consumer": SpanKind.CONSUMER,
            "internal": SpanKind.INTERNAL,
        }
        self.error = Status(StatusCode.ERROR)

    def start(
        self, name: str, kind: str, parent: TraceContext | None, attributes: Mapping[str, Any]
    ) -> tuple[Any, TraceContext]:
        trace = self.trace
        context = None
        if parent is not None:
            remote = trace.SpanContext(
                int(parent.trace_id, 16),
                int(parent.span_id, 16),
                is_remote=True,
                trace_flags=trace.TraceFlags(1 if parent.sampled else 0),
            )
            context = trace.set_span_in_context(trace.NonRecordingSpan(remote))
        span = self.tracer.start_span(
            name, context=context, kind=self.kinds[kind], attributes=attributes
        )
        sc = span.get_span_context()
        return span, TraceContext(
            f"{sc.trace_id:032x}", f"{sc.span_id:016x}", bool(sc.trace_flags & 1)
        )


_OTEL: _Otel | None = None


class Span:
    """A span made current by ``start``: ``end()`` it in the same task."""

    __slots__ = ("_otel", "_request", "_token", "context")

    def __init__(
        self,
        context: TraceContext,
        otel: Any,
        token: Token[TraceContext | None],
        request: Token[str | None] | None,
    ) -> None:
        self.context, self._otel, self._token, self._request = context, otel, token, request

    @property
    def exported(self) -> bool:
        """Whether this is an OpenTelemetry span (an exporter is configured)."""
        return self._otel is not None

    def set(self, key: str, value: Any) -> None:
        if self._otel is not None:
            self._otel.set_attribute(key, value)

    def rename(self, name: str) -> None:
        if self._otel is not None:
            self._otel.update_name(name)

    def fail(self, exc: BaseException) -> None:
        if self._otel is not None and _OTEL is not None:
            self._otel.record_exception(exc)
            self._otel.set_status(_OTEL.error)

    def end(self) -> None:
        if self._otel is not None:
            self._otel.end()
        _CONTEXT.reset(self._token)
        if self._request is not None:
            _REQUEST.reset(self._request)


class _Current:
    """The default parent: whatever span is current."""


_CURRENT = _Current()


def start(
    name: str,
    kind: str = "internal",
    parent: TraceContext | _Current | None = _CURRENT,
    attributes: Mapping[str, Any] | None = None,
    request_id: str | None = None,
) -> Span:
    """A new span, current until its ``end()``: a child of ``parent`` (by default
    the current span), or the root of a new trace when there is none. With
    ``request_id``, that id is the current one until the end too."""
    if isinstance(parent, _Current):
        parent = _CONTEXT.get()
    otel = _OTEL
    if otel is None:
        if parent is None:
            ctx = TraceContext(_new_trace_id(), _new_span_id(), False)
        else:
            ctx = TraceContext(parent.trace_id, _new_span_id(), parent.sampled)
        span = None
    else:
        span, ctx = otel.start(name, kind, parent, attributes or {})
    request = None if request_id is None else _REQUEST.set(request_id)
    return Span(ctx, span, _CONTEXT.set(ctx), request)


@contextmanager
def span(
    name: str,
    kind: str = "internal",
    parent: TraceContext | _Current | None = _CURRENT,
    attributes: Mapping[str, Any] | None = None,
    request_id: str | None = None,
) -> Iterator[Span]:
    """``start`` as a context manager; an exception marks the span failed."""
    current_span = start(name, kind, parent, attributes, request_id)
    try:
        yield current_span
    except BaseException as exc:
        current_span.fail(exc)
        raise
    finally:
        current_span.end()


def handling(
    traceparent: str | None, request_id: str | None, name: str, attributes: Mapping[str, Any]
) -> Any:
    """The consumer's work on one event: a span in the event's trace (a new
    trace when it carries none), under the request id that caused it."""
    return span(name, "consumer", parse_traceparent(traceparent), attributes, request_id)


class Detached:
    """A span that is never the current one: what a batch of events gets, one
    per event, each in its own trace (a context variable holds one span at a
    time). Work on the event names it as its parent through ``context``."""

    __slots__ = ("_otel", "context")

    def __init__(self, context: TraceContext, otel: Any) -> None:
        self.context, self._otel = context, otel

    def fail(self, exc: BaseException) -> None:
        if self._otel is not None and _OTEL is not None:
            self._otel.record_exception(exc)
            self._otel.set_status(_OTEL.error)

    def end(self) -> None:
        if self._otel is not None:
            self._otel.end()


def handling_detached(
    traceparent: str | None, name: str, attributes: Mapping[str, Any]
) -> Detached:
    """``handling``'s consumer span for one event of a batch, not made current."""
    parent = parse_traceparent(traceparent)
    otel = _OTEL
    if otel is None:
        trace_id = _new_trace_id() if parent is None else parent.trace_id
        sampled = False if parent is None else parent.sampled
        return Detached(TraceContext(trace_id, _new_span_id(), sampled), None)
    span, ctx = otel.start(name, "consumer", parent, attributes)
    return Detached(ctx, span)


def parent_for(traceparent: str | None) -> TraceContext | None:
    """The parent of work on an event of that trace: the current span when it
    is already in that trace (the consumer's span), else the event's context."""
    given = parse_traceparent(traceparent)
    ctx = _CONTEXT.get()
    if ctx is not None and given is not None and ctx.trace_id == given.trace_id:
        return ctx
    return given


def publishing(traceparent: str | None, name: str, attributes: Mapping[str, Any]) -> str | None:
    """The ``traceparent`` a published record carries: the event's own, or, with
    an exporter, that of a producer span in the event's trace (recorded at once:
    the record is on its way)."""
    if _OTEL is None:
        return traceparent
    parent = parse_traceparent(traceparent)
    with span(name, "producer", parent, attributes) as s:
        return s.context.traceparent


def outgoing_headers() -> dict[str, str]:
    """What an outbound call or message carries of the current work."""
    headers: dict[str, str] = {}
    ctx = _CONTEXT.get()
    if ctx is not None:
        headers["traceparent"] = ctx.traceparent
    rid = _REQUEST.get()
    if rid is not None:
        headers["X-Request-ID"] = rid
    return headers


# -- set-up -----------------------------------------------------------------------------


def exporter_configured(environ: Mapping[str, str]) -> bool:
    """Whether the standard OTEL_* variables ask for a trace exporter: an OTLP
    endpoint, or OTEL_TRACES_EXPORTER=otlp; not when the SDK is disabled or the
    exporter is ``none``."""
    if environ.get("OTEL_SDK_DISABLED", "").strip().lower() == "true":
        return False
    exporter = environ.get("OTEL_TRACES_EXPORTER", "").strip().lower()
    if exporter == "none":
        return False
    return exporter == "otlp" or bool(
        environ.get("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT")
        or environ.get("OTEL_EXPORTER_OTLP_ENDPOINT")
    )


def setup(environ: Mapping[str, str], service: str = "reservo") -> bool:
    """Spans exported over OTLP/HTTP when the environment configures an exporter
    (endpoint, headers, sampler, batch sizes: the SDK reads its own variables);
    ids only otherwise. True when spans are on."""
    if _OTEL is not None:  # already on (one process may be set up twice)
        return True
    if not exporter_configured(environ):
        return False
    protocol = environ.get(
        "OTEL_EXPORTER_OTLP_TRACES_PROTOCOL", environ.get("OTEL_EXPORTER_OTLP_PROTOCOL", "")
    )
    if protocol and protocol != "http/protobuf":
        log.warning("otel_protocol_unsupported", protocol=protocol, used="http/protobuf")
    from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
    from opentelemetry.sdk.resources import Resource
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import BatchSpanProcessor

    attributes = {} if environ.get("OTEL_SERVICE_NAME") else {"service.name": service}
    provider = TracerProvider(resource=Resource.create(attributes))
    provider.add_span_processor(BatchSpanProcessor(OTLPSpanExporter()))
    use_provider(provider)
    log.info("tracing_enabled", exporter="otlp", service=service)
    return True


def use_provider(provider: Any) -> None:
    """Spans go to ``provider`` (an SDK TracerProvider) from now on; None: ids only."""
    global _OTEL
    _OTEL = None if provider is None else _Otel(provider)


def shutdown() -> None:
    """Flushes the spans still buffered (at the end of the process)."""
    otel = _OTEL
    if otel is not None:
        otel.provider.shutdown()


# -- HTTP -------------------------------------------------------------------------------


class RequestObserver(Protocol):
    def observe(self, method: str, route: str, status: int, started: float, ended: float) -> None:
        """``started``, ``ended``: ``time.perf_counter()`` readings."""


class TracedRequests:
    """Every HTTP request in its trace and under its request id, the id echoed
    in ``X-Request-ID`` and the server's span in ``traceresponse`` (W3C Trace
    Context Level 2: ``00-<trace id>-<span id>-<flags>``, so a caller matches its
    call to the trace without reading logs). A ``traceparent`` that is not valid
    starts a new trace (as the standard says); an ``X-Request-ID`` that is not
    valid (too long, or characters that could break a log line or a header) is
    replaced by a new id, never refused: the id is the caller's aid to finding
    its request, not a reason to turn it away. The one given is logged once
    (``request_id_replaced``), escaped and cut to ``REQUEST_ID_MAX`` characters,
    under the new id. ``access_log``, when given, writes the request's line
    (core/kernel/access_log.py), and ``observer`` is told how each request
    ended (the request metrics): both from the one status and the one timing
    taken here, not from wrappers of their own around every send."""

    def __init__(
        self,
        app: ASGIApp,
        access_log: AccessLog | None = None,
        observer: RequestObserver | None = None,
    ) -> None:
        self.app = app
        self.access_log = access_log
        self.observer = observer

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        traceparent = given = None
        for name, value in scope["headers"]:
            if name == b"traceparent":
                traceparent = traceparent or value
            elif name == b"x-request-id":
                given = given or value
        replaced = None
        if given is not None and not valid_request_id(given):
            replaced, given = given, None
        if _OTEL is None:
            await self._ids_only(scope, receive, send, traceparent, given, replaced)
            return
        rid = new_request_id() if given is None else given.decode("ascii")
        method = scope["method"]
        parent = None if traceparent is None else parse_traceparent(traceparent)
        started = time.perf_counter()
        current = start(
            method,
            "server",
            parent,
            {"http.request.method": method, "url.path": scope["path"]},
            rid,
        )
        echo = _echoed(rid.encode("ascii"), current.context)
        if replaced is not None:
            _log_replaced(replaced)
        status = 500

        async def echoing(message: Message) -> None:
            nonlocal status
            if message["type"] == "http.response.start":
                status = message["status"]
                message = {**message, "headers": [*message.get("headers", ()), *echo]}
            await send(message)

        try:
            await self.app(scope, receive, echoing)
        except BaseException as exc:
            current.fail(exc)
            raise
        finally:
            route = getattr(scope.get("route"), "path", None)
            if current.exported:
                current.set("http.response.status_code", status)
                if route is not None:
                    current.set("http.route", route)
                    current.rename(f"{method} {route}")
            self._ended(method, route, status, started, current.context.sampled)
            current.end()

    async def _ids_only(
        self,
        scope: Scope,
        receive: Receive,
        send: Send,
        traceparent: bytes | None,
        given: bytes | None,
        replaced: bytes | None,
    ) -> None:
        """The common case, kept to a few microseconds: no exporter; only the
        ids, set for the request and echoed, and the access log's line. A request
        that came without an id and without a trace gets one number for both (its
        request id is its trace id): one random draw less per request."""
        started = time.perf_counter()
        parent = None if traceparent is None else parse_traceparent(traceparent)
        if parent is None:
            trace_id = _new_trace_id()
            ctx = TraceContext(trace_id, _new_span_id(), False)
            rid = trace_id if given is None else given.decode("ascii")
        else:
            ctx = TraceContext(parent.trace_id, _new_span_id(), parent.sampled)
            rid = new_request_id() if given is None else given.decode("ascii")
        echo = _echoed(given or rid.encode("ascii"), ctx)
        status = 500

        async def echoing(message: Message) -> None:
            nonlocal status
            if message["type"] == "http.response.start":
                status = message["status"]
                message = {**message, "headers": [*message.get("headers", ()), *echo]}
            await send(message)

        trace_token, request_token = _CONTEXT.set(ctx), _REQUEST.set(rid)
        try:
            if replaced is not None:
                _log_replaced(replaced)
            await self.app(scope, receive, echoing)
        finally:
            route = getattr(scope.get("route"), "path", None)
            self._ended(scope["method"], route, status, started, ctx.sampled)
            _CONTEXT.reset(trace_token)
            _REQUEST.reset(request_token)

    def _ended(
        self, method: str, route: str | None, status: int, started: float, sampled: bool
    ) -> None:
        """Still under the request's ids (its exemplar, its log line's)."""
        ended = time.perf_counter()
        if self.observer is not None:
            # The router wrote the route it matched into the scope (matching
            # here instead missed every route of an included router).
            self.observer.observe(method, route or "unmatched", status, started, ended)
        if self.access_log is not None:
            self.access_log.request(method, route, status, ended - started, sampled)


def _echoed(request_id: bytes, ctx: TraceContext) -> tuple[tuple[bytes, bytes], ...]:
    """The headers every answer carries: its request id and its trace position."""
    return (b"x-request-id", request_id), (b"traceresponse", ctx.traceparent.encode("ascii"))


def _log_replaced(given: bytes) -> None:
    """The caller's unusable id, for finding the request by it: escaped (no
    control character or non-ASCII byte reaches the log as itself) and cut to
    ``REQUEST_ID_MAX`` characters, whatever length was sent."""
    escaped = given[: REQUEST_ID_MAX * 4].decode("latin-1").encode("unicode_escape")
    shown = escaped.decode("ascii")[:REQUEST_ID_MAX]
    log.info("request_id_replaced", given=shown, given_bytes=len(given))
