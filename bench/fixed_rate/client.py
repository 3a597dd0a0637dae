"""The open-loop client of bench/fixed_rate/run.py, one process per load.

Request i is due at ``start + i / rate`` whatever the server does; a free
connection of ``--connections`` sends it (they queue when all are busy, and
that wait counts in its latency: measured from the due time, so a slow answer
is never hidden by the client waiting for it, as a closed loop's would be).
Requests still queued ``--grace`` seconds after the last one was due are not
sent (status 0). Raw HTTP/1.1 over asyncio streams on uvloop, every request
prebuilt.

    python client.py --requests FILE --port P --rate R --connections C --out OUT

FILE is a pickled list of raw requests; OUT gets JSON: each request's latency
in ms (in order; -1 when unsent or failed), its status key (the status, and a
4xx problem's code), and this process's CPU seconds.

Why not a packaged tool: Debian's ``hey -q`` limits each of its workers to a
rate but sends one fixed request (one token, one Idempotency-Key: every
booking after the first would be a replay) and waits for each answer before
the next (a closed loop per worker); ``h2load --rate`` starts connections at a
rate, not requests.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import pickle
import resource
import time
from pathlib import Path

import orjson


def status_key(status: int, body: bytes) -> str:
    """As wrk_report.lua counts: a problem's code beside its status; an empty list."""
    if status >= 400:
        with contextlib.suppress(ValueError, TypeError, AttributeError):
            return f"{status} {orjson.loads(body).get('code')}"
    if status == 200 and body == b"[]":
        return "200 empty"
    return str(status)


async def open_loop(
    port: int, reqs: list[bytes], rate: float, connections: int, grace_s: float
) -> tuple[list[float], list[str]]:
    n = len(reqs)
    latency, keys = [-1.0] * n, ["0"] * n
    queue: asyncio.Queue[tuple[int, float]] = asyncio.Queue()
    start = time.perf_counter() + 0.3

    async def connection() -> None:
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        try:
            while True:
                i, due = await queue.get()
                queue.task_done()  # taken: join() waits for the queue to be emptied
                if i < 0:
                    return
                writer.write(reqs[i])
                head = await reader.readuntil(b"\r\n\r\n")
                length = 0
                for line in head.split(b"\r\n"):
                    if line[:15].lower() == b"content-length:":
                        length = int(line[15:])
                body = await reader.readexactly(length)
                # A timer may wake a little early: such a request counts as on time.
                latency[i] = max(0.0, (time.perf_counter() - due) * 1000)
                keys[i] = status_key(int(head[9:12]), body)
        finally:
            writer.close()

    clients = [asyncio.create_task(connection()) for _ in range(connections)]
    await asyncio.sleep(0)  # the connections open before the first request is due
    for i in range(n):
        due = start + i / rate
        delay = due - time.perf_counter()
        if delay > 0:  # never early; a late request is sent at once, its lateness counted
            await asyncio.sleep(delay)
        queue.put_nowait((i, due))
    with contextlib.suppress(TimeoutError):
        await asyncio.wait_for(
            queue.join(), max(0.0, start + n / rate + grace_s - time.perf_counter())
        )
    while not queue.empty():
        queue.get_nowait()
        queue.task_done()
    for _ in clients:
        queue.put_nowait((-1, 0.0))
    for result in await asyncio.gather(*clients, return_exceptions=True):
        if isinstance(result, BaseException):
            print(f"  a client connection failed: {result!r}", flush=True)
    return latency, keys


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--requests", type=Path, required=True)
    p.add_argument("--port", type=int, required=True)
    p.add_argument("--rate", type=float, required=True)
    p.add_argument("--connections", type=int, default=128)
    p.add_argument("--grace", type=float, default=5.0)
    p.add_argument("--out", type=Path, required=True)
    opts = p.parse_args()
    reqs = pickle.loads(opts.requests.read_bytes())
    with contextlib.suppress(ImportError):
        import uvloop

        uvloop.install()
    latency, keys = asyncio.run(open_loop(opts.port, reqs, opts.rate, opts.connections, opts.grace))
    usage = resource.getrusage(resource.RUSAGE_SELF)
    cpu_s = usage.ru_utime + usage.ru_stime
    opts.out.write_text(json.dumps({"latency_ms": latency, "keys": keys, "cpu_s": cpu_s}))


if __name__ == "__main__":
    main()
