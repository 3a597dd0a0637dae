"""Which latency observations carry their trace id as an exemplar
(core/http/request_metrics.py): every sampled trace, every slow request, and
otherwise one per route per second; the rest are observed without one (a
validated exemplar on every cheap request cost a tenth of its Python work)."""

from __future__ import annotations

import pytest

from reservo.core.http.request_metrics import (
    EXEMPLAR_EVERY_S,
    SLOW_EXEMPLAR_S,
    RequestMetrics,
)
from reservo.core.kernel import metrics, tracing

pytestmark = pytest.mark.skipif(metrics.MULTIPROCESS, reason="no exemplars under several processes")


def _observe(observed: RequestMetrics, route: str, at: float, seconds: float, sampled: bool) -> str:
    parent = tracing.TraceContext(f"{int(at * 1000) + 1:032x}", "1" * 16, sampled)
    with tracing.span("request", parent=parent) as span:
        observed.observe("GET", route, 200, at - seconds, at)
        return span.context.trace_id


def _exemplars(route: str) -> set[str]:
    found = set()
    for family in metrics.HTTP_LATENCY.collect():
        for sample in family.samples:
            if sample.labels.get("route") == route and sample.exemplar is not None:
                found.add(sample.exemplar.labels["trace_id"])
    return found


def test_an_unsampled_fast_route_carries_one_exemplar_a_second() -> None:
    route, observed = "/exemplars/every-second", RequestMetrics()
    first = _observe(observed, route, 100.0, 0.001, sampled=False)
    # In another bucket (each bucket shows its own latest exemplar), still fast.
    within = [_observe(observed, route, 100.0 + i / 10, 0.03, False) for i in range(1, 9)]
    later = _observe(observed, route, 100.0 + EXEMPLAR_EVERY_S, 0.001, sampled=False)
    shown = _exemplars(route)
    assert first not in shown and later in shown  # the bucket keeps the latest
    assert not shown & set(within), "an exemplar was attached within the second"


def test_sampled_and_slow_requests_always_carry_theirs() -> None:
    route, observed = "/exemplars/always", RequestMetrics()
    _observe(observed, route, 200.0, 0.001, sampled=False)
    sampled = _observe(observed, route, 200.1, 0.001, sampled=True)
    slow = _observe(observed, route, 200.2, SLOW_EXEMPLAR_S * 2, sampled=False)
    assert {sampled, slow} <= _exemplars(route)
