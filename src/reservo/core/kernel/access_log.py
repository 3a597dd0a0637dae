"""The access log: one ``request`` line per HTTP request, under its ids.

On by default: without it the request id finds every line a request wrote but
none saying that it came, how it ended and how long it took. On the hot routes
(a module's ``hot`` endpoints: the booking storm's, the slot lists) one line per
request would cost a share of the cheapest requests' CPU, so there only a
fraction is logged (``sample``), chosen by counting rather than by chance (an
exact share, no random draw). Whatever the route, a line is always written for
an answer of 500 or more, a request slower than ``slow_ms``, and a request whose
trace is sampled (its ``traceparent`` flag, or the exporter's decision): the
requests someone will look for."""

from __future__ import annotations

from collections.abc import Iterable

import structlog

log = structlog.get_logger("reservo.access")
_WHOLE = 1_000_000


class AccessLog:
    def __init__(self, sample: float, slow_ms: float, hot_paths: Iterable[str] = ()) -> None:
        self.slow_s = slow_ms / 1000
        self.hot_paths = frozenset(hot_paths)
        # Millionths of a line owed to the hot routes; a line is due at each whole
        # one. Whole numbers: 0.1 added ten times is not 1.0 in floats.
        self._step = round(sample * _WHOLE)
        self._owed = 0

    def wanted(self, route: str | None, status: int, seconds: float, sampled: bool) -> bool:
        if route not in self.hot_paths or status >= 500 or seconds >= self.slow_s or sampled:
            return True
        self._owed += self._step
        if self._owed >= _WHOLE:
            self._owed -= _WHOLE
            return True
        return False

    def request(
        self, method: str, route: str | None, status: int, seconds: float, sampled: bool
    ) -> None:
        if self.wanted(route, status, seconds, sampled):
            log.info(
                "request",
                method=method,
                route=route or "unmatched",
                status=status,
                duration_ms=round(seconds * 1000, 3),
            )
