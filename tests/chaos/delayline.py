"""A userspace delay line, for kernels without ``sch_netem`` (tests/chaos/netns.py).

A TCP forwarder: every connection accepted on ``--listen`` is forwarded to
``--to``, and while the line is *on* each chunk read from either side is held
``delay ± jitter`` ms before it is written to the other, in the order it was read
(a chunk never overtakes the one before it, as on one TCP path). Off, it forwards
at once. SIGUSR1 turns it on, SIGUSR2 off, so a test can slow the path and heal it
without cutting the connections that cross it.

Standard library only: it is run by path (``python delayline.py``) inside a lab
host's network namespace, where nothing else of the suite is imported.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import random
import signal

CHUNK = 65536


class Line:
    def __init__(self, delay_ms: float, jitter_ms: float) -> None:
        self.delay_s, self.jitter_s = delay_ms / 1000, jitter_ms / 1000
        self.on = False

    def hold_s(self) -> float:
        if not self.on:
            return 0.0
        return max(0.0, self.delay_s + random.uniform(-self.jitter_s, self.jitter_s))


async def _pump(line: Line, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    """One direction of one connection: a reader queues each chunk with the time
    it is due, a writer sends it then. Due times never go back, so order holds."""
    loop = asyncio.get_running_loop()
    queue: asyncio.Queue[tuple[float, bytes]] = asyncio.Queue()

    async def read() -> None:
        last = 0.0
        with contextlib.suppress(OSError):
            while chunk := await reader.read(CHUNK):
                last = max(loop.time() + line.hold_s(), last)
                queue.put_nowait((last, chunk))
        queue.put_nowait((last, b""))

    async def write() -> None:
        while True:
            due, chunk = await queue.get()
            if (wait := due - loop.time()) > 0:
                await asyncio.sleep(wait)
            if not chunk:
                with contextlib.suppress(OSError):
                    writer.write_eof()
                return
            writer.write(chunk)
            await writer.drain()

    await asyncio.gather(read(), write())


async def _serve(line: Line, host: str, port: int, client: asyncio.StreamReader,
                 to_client: asyncio.StreamWriter) -> None:  # fmt: skip
    try:
        upstream, to_upstream = await asyncio.open_connection(host, port)
    except OSError:
        to_client.close()
        return
    try:
        await asyncio.gather(_pump(line, client, to_upstream), _pump(line, upstream, to_client))
    except OSError:
        pass
    finally:
        for w in (to_client, to_upstream):
            w.close()


async def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--listen", required=True, help="address:port")
    parser.add_argument("--to", required=True, help="address:port")
    parser.add_argument("--delay-ms", type=float, default=0)
    parser.add_argument("--jitter-ms", type=float, default=0)
    parser.add_argument("--on", action="store_true", help="start slowed")
    args = parser.parse_args()
    line = Line(args.delay_ms, args.jitter_ms)
    line.on = args.on
    loop = asyncio.get_running_loop()
    loop.add_signal_handler(signal.SIGUSR1, lambda: setattr(line, "on", True))
    loop.add_signal_handler(signal.SIGUSR2, lambda: setattr(line, "on", False))
    host, port = args.to.rsplit(":", 1)
    listen_host, listen_port = args.listen.rsplit(":", 1)
    server = await asyncio.start_server(
        lambda r, w: _serve(line, host, int(port), r, w), listen_host, int(listen_port)
    )
    async with server:
        await server.serve_forever()


if __name__ == "__main__":
    asyncio.run(main())
