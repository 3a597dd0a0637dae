"""The HTTP server's graceful stop, as an orchestrator expects it.

A load balancer learns that an instance is going away only from its readiness
probe (or, in Kubernetes, from the endpoint update, which takes a while to reach
every proxy). Stopping to accept on SIGTERM at once refuses the requests still
being routed here. So SIGTERM first begins a *drain* of ``drain_s`` seconds:

* /readyz answers 503 ``draining`` (without touching any dependency);
* every request is still served, and each answer closes its connection
  (``Connection: close``), so no kept-alive connection is left idle to be cut;
* then the server's own SIGTERM handler runs: uvicorn stops accepting, lets the
  requests in flight finish (``timeout_graceful_shutdown``), and exits.

SIGINT (Ctrl-C) skips the drain: it goes straight to the server's handler (a
second one forces the exit). A repeated SIGTERM does not shorten the drain (a
process group's SIGTERM reaches a worker and its supervisor, which forwards it).

``Drain.install`` wraps whatever SIGTERM handler the server put in place, so it
works the same in ``reservo api`` (one process or ``--workers N``) and in
``reservo up``; it does nothing where no server handles SIGTERM (tests that drive
the app in-process)."""

from __future__ import annotations

import asyncio
import signal
import threading
from collections.abc import Mapping
from types import FrameType
from typing import Any

import structlog

from reservo.core.kernel.metrics import HTTP_DRAINING

log = structlog.get_logger(__name__)

# The key of the Drain in the ASGI lifespan state, which uvicorn hands to every
# connection it makes (``app_state``) and to every request (``scope["state"]``).
STATE_KEY = "drain"


class Drain:
    def __init__(self, drain_s: float) -> None:
        self.drain_s = drain_s
        self.active = False
        self._installed: Any = None
        self._server_handler: Any = None

    def install(self) -> None:
        """Put the drain in front of the server's SIGTERM handler (call it from
        the app's lifespan startup, in the serving loop)."""
        if self.drain_s <= 0 or threading.current_thread() is not threading.main_thread():
            return
        handler = signal.getsignal(signal.SIGTERM)
        if not callable(handler):
            return  # no server to hand the stop over to
        loop = asyncio.get_running_loop()

        def on_sigterm(signum: int, frame: FrameType | None) -> None:
            # A signal handler: only hand the work to the loop (thread-safe wake-up).
            loop.call_soon_threadsafe(self._begin, loop)

        self._server_handler = handler
        self._installed = on_sigterm
        signal.signal(signal.SIGTERM, on_sigterm)

    def uninstall(self) -> None:
        """Give SIGTERM back to the server (lifespan shutdown)."""
        if self._installed is not None and signal.getsignal(signal.SIGTERM) is self._installed:
            signal.signal(signal.SIGTERM, self._server_handler)
        self._installed = None

    def _begin(self, loop: asyncio.AbstractEventLoop) -> None:
        if self.active:
            return
        self.active = True
        HTTP_DRAINING.set(1)
        log.info("http.draining", drain_s=self.drain_s)
        loop.call_later(self.drain_s, self._stop)

    def _stop(self) -> None:
        log.info("http.stopping")
        self._server_handler(signal.SIGTERM, None)


def draining(state: Mapping[str, Any]) -> bool:
    """Whether the process serving this lifespan state is draining."""
    drain = state.get(STATE_KEY)
    return isinstance(drain, Drain) and drain.active
