"""Request count and latency per method, route template and status, for every
route (a concern of the request pipeline, core/http/pipeline.py). The request's
status and timing are the ones TracedRequests takes (core/kernel/tracing.py,
its ``observer``): a wrapper of its own around every send cost a frame per
message and another per request."""

from __future__ import annotations

from typing import Any

from reservo.core.kernel import metrics, tracing

# A request slower than this always carries its exemplar.
SLOW_EXEMPLAR_S = 0.1
# Otherwise a route's observations carry one at most this often (and whenever
# the caller's trace is sampled).
EXEMPLAR_EVERY_S = 1.0


class RequestMetrics:
    """Request count and latency per method, route template and status. The
    labelled children are looked up once each: ``labels()`` validates and locks
    on every call. Same label sets as ``labels()`` would create.

    Latency observations carry the request's trace id as their exemplar
    (OpenMetrics): the slow request a bucket counted is one click from its
    trace, and from its log lines (the trace id is on every one). A bucket
    keeps only its latest exemplar, and attaching one is validated on each
    call (a tenth of a cheap request's own Python work), so it is attached
    where it can be the one shown: to every sampled trace (OpenTelemetry's
    trace-based exemplar filter), to every request slower than
    ``SLOW_EXEMPLAR_S``, and otherwise once per ``EXEMPLAR_EVERY_S`` per route.
    Not under several processes: prometheus-client keeps no exemplars there."""

    def __init__(self) -> None:
        self._latency: dict[tuple[str, str], Any] = {}
        self._count: dict[tuple[str, str, int], Any] = {}
        self._next_exemplar: dict[tuple[str, str], float] = {}

    def observe(self, method: str, route: str, status: int, started: float, ended: float) -> None:
        """``started`` and ``ended``: ``time.perf_counter()`` readings."""
        key = (method, route)
        latency = self._latency.get(key)
        if latency is None:
            latency = self._latency[key] = metrics.HTTP_LATENCY.labels(method, route)
        seconds = ended - started
        ctx = None if metrics.MULTIPROCESS else tracing.current()
        if ctx is not None and (
            ctx.sampled or seconds >= SLOW_EXEMPLAR_S or ended >= self._next_exemplar.get(key, 0.0)
        ):
            latency.observe(seconds, {"trace_id": ctx.trace_id})
            self._next_exemplar[key] = ended + EXEMPLAR_EVERY_S
        else:
            latency.observe(seconds)
        count = self._count.get((method, route, status))
        if count is None:
            count = self._count[method, route, status] = metrics.HTTP_REQUESTS.labels(
                method, route, str(status)
            )
        count.inc()


# One per process.
REQUEST_METRICS = RequestMetrics()
