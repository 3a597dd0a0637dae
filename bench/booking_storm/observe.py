"""What the access log and the ``traceresponse`` header cost per request, in one
process, each variant measured in the same invocation, rounds interleaved (the
machine is shared: a variant measured later would meet other load).

- ``middleware``: TracedRequests alone around an app that answers 409 at once:
  the middleware as of ``--before`` (a git revision: no ``traceresponse``, no
  access log) against this tree's without an access log (the header alone), with
  the hot routes' sampled log (the default, 1 in 10) and with a line per request.
- ``exemplar``: one latency observation without and with its trace-id exemplar
  (core/http/request_metrics.py's RequestMetrics, once per request).
- ``storm``: the whole app's refused booking (bench/booking_storm/cpu.py's
  request), access log off, sampled (default), every request.

Log lines are rendered as in production (JSON) and written to /dev/null: the
write to a real pipe or file adds its own cost on top.

    python bench/booking_storm/observe.py --requests 20000 --rounds 5 --before main
"""

from __future__ import annotations

import argparse
import asyncio
import importlib.util
import os
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import httpx
from starlette.types import Message, Receive, Scope, Send

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

import cpu  # noqa: E402

from reservo.app import create_app  # noqa: E402
from reservo.bootstrap import build  # noqa: E402
from reservo.core.kernel import metrics, tracing  # noqa: E402
from reservo.core.kernel.access_log import AccessLog  # noqa: E402
from reservo.core.kernel.logging import configure  # noqa: E402
from reservo.settings import Settings  # noqa: E402

HOT = "/api/appointments"


class _Route:
    path = HOT


async def _refusal(scope: Scope, receive: Receive, send: Send) -> None:
    scope["route"] = _Route
    await send({"type": "http.response.start", "status": 409, "headers": []})
    await send({"type": "http.response.body", "body": b"{}"})


def _tracing_before(revision: str) -> Any:
    """core/kernel/tracing.py as of ``revision``, imported under a name of its own."""
    source = subprocess.run(
        ["git", "show", f"{revision}:src/reservo/core/kernel/tracing.py"],
        capture_output=True,
        check=True,
        cwd=HERE,
    ).stdout
    path = Path(tempfile.mkdtemp()) / "tracing_before.py"
    path.write_bytes(source)
    spec = importlib.util.spec_from_file_location("tracing_before", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up
    spec.loader.exec_module(module)
    return module


async def _middleware(app: Any, n: int) -> float:
    headers = [(b"host", b"bench"), (b"content-type", b"application/json")]
    sent: list[Message] = []

    async def receive() -> Message:
        return {"type": "http.request", "body": b"", "more_body": False}

    async def send(message: Message) -> None:
        if len(sent) < 2:
            sent.append(message)

    cpu_started = time.process_time()
    for _ in range(n):
        await app(cpu._scope("POST", HOT, b"", headers), receive, send)
    return (time.process_time() - cpu_started) / n * 1e6


def _log_to_devnull() -> None:
    """Logging as in production (JSON), its lines going nowhere: the stream is
    taken when logging is configured."""
    stderr, sys.stderr = sys.stderr, open(os.devnull, "w")  # noqa: SIM115
    configure("INFO", json=True)
    sys.stderr, sys.excepthook = stderr, sys.__excepthook__  # the bench's own failures seen


async def _timed(call: Callable[[], None], n: int) -> float:
    cpu_started = time.process_time()
    for _ in range(n):
        call()
    return (time.process_time() - cpu_started) / n * 1e6


async def main(args: argparse.Namespace) -> None:
    _log_to_devnull()
    before = _tracing_before(args.before)
    variants: dict[str, Callable[[int], Awaitable[float]]] = {}
    for name, app in {
        f"middleware {args.before}": before.TracedRequests(_refusal),
        "middleware traceresponse": tracing.TracedRequests(_refusal),
        "middleware +log 1/10": tracing.TracedRequests(_refusal, AccessLog(0.1, 500, [HOT])),
        "middleware +log all": tracing.TracedRequests(_refusal, AccessLog(1.0, 500, [HOT])),
    }.items():
        variants[name] = lambda n, app=app: _middleware(app, n)

    latency = metrics.HTTP_LATENCY.labels("POST", "/bench")
    exemplar = {"trace_id": "4bf92f3577b34da6a3ce929d0e0e4736"}
    variants["latency observe"] = lambda n: _timed(lambda: latency.observe(0.003), n)
    variants["latency observe +exemplar"] = lambda n: _timed(
        lambda: latency.observe(0.003, exemplar), n
    )

    url = await cpu._setup_db(args.database_url)
    base = Settings(
        database_url=url,
        redis_url=args.redis_url,
        jwt_secret=cpu.SECRET,
        redis_namespace=f"observe-{uuid.uuid4().hex[:8]}",
        payments_webhook_secret="bench-payments-webhook-secret-0123456789",
        results_webhook_secret="bench-results-webhook-secret-0123456789",
        rentals_payment_gateway="sandbox",
        # Every variant's rounds draw from the same 20,000 patients.
        appointments_booking_rate_limit=10**9,
    )
    containers = []
    try:
        storm_apps = {}
        for name, settings in {
            "storm log off": base.with_(access_log=False),
            "storm log 1/10": base,
            "storm log all": base.with_(access_log_sample=1.0),
        }.items():
            container = build(settings)
            containers.append(container)
            await container.db.connect()
            storm_apps[name] = create_app(container, owns_container=False)
        first = next(iter(storm_apps.values()))
        async with httpx.AsyncClient(
            transport=httpx.ASGITransport(app=first), base_url="http://bench"
        ) as c:
            _, _, slots = await cpu._full_slots(c, 30)
        tokens = [cpu._bearer("patient", p + 1) for p in range(cpu.PATIENTS)]

        for name, app in storm_apps.items():

            async def storm(n: int, app: Any = app) -> float:
                reqs = cpu.storm_requests(n, slots, tokens, uuid.uuid4().hex[:8])
                us, statuses = await cpu.measure(app, reqs)
                assert set(statuses) == {409}, statuses
                return us

            variants[name] = storm

        for fn in variants.values():  # warm every path
            await fn(2000)
        results: dict[str, list[float]] = {k: [] for k in variants}
        for _ in range(args.rounds):
            for name, fn in variants.items():
                results[name].append(await fn(args.requests))
        for name, values in results.items():
            runs = ", ".join(f"{v:.1f}" for v in values)
            print(f"{name:28s} median {statistics.median(values):7.1f} us/request ({runs})")
    finally:
        for container in containers:
            await container.close()
        await cpu._drop_db(args.database_url, url)


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--requests", type=int, default=20_000)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--before", default="main", help="git revision of the 'before' middleware")
    parser.add_argument("--database-url", default="postgresql://postgres@127.0.0.1:5432/postgres")
    parser.add_argument("--redis-url", default="redis://127.0.0.1:6379/0")
    asyncio.run(main(parser.parse_args()))
