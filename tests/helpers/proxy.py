"""A TCP proxy on 127.0.0.1 that a test can cut, to lose a server without stopping it."""

from __future__ import annotations

import asyncio


class TcpProxy:
    """Forwards a local port to PostgreSQL; ``stop`` is an outage (listener and
    every connection closed), ``start`` brings it back on the same port;
    ``blackhole`` is a lost machine (connections accepted, never answered, the
    open ones cut) until ``forward`` again."""

    def __init__(self, port: int, upstream: tuple[str, int]) -> None:
        self.port, self.upstream = port, upstream
        self.holes = False
        self._server: asyncio.Server | None = None
        self._writers: set[asyncio.StreamWriter] = set()
        self._pumps: set[asyncio.Task[None]] = set()

    @property
    def listening(self) -> bool:
        return self._server is not None

    async def start(self) -> None:
        self._server = await asyncio.start_server(
            self._serve, "127.0.0.1", self.port, reuse_address=True
        )

    async def stop(self) -> None:
        assert self._server is not None
        self._server.close()
        for w in list(self._writers):
            w.transport.abort()  # like a dead host: no polite shutdown
        for t in list(self._pumps):
            t.cancel()
        await asyncio.gather(*self._pumps, return_exceptions=True)
        await self._server.wait_closed()
        self._server = None

    def blackhole(self) -> None:
        self.holes = True
        for w in list(self._writers):
            w.transport.abort()

    def forward(self) -> None:
        self.holes = False
        for w in list(self._writers):
            w.transport.abort()  # the held connections: a client reconnects

    async def _serve(self, creader: asyncio.StreamReader, cwriter: asyncio.StreamWriter) -> None:
        if self.holes:
            self._writers.add(cwriter)  # held open, never answered
            return
        try:
            ureader, uwriter = await asyncio.open_connection(*self.upstream)
        except OSError:
            cwriter.transport.abort()
            return
        self._writers |= {cwriter, uwriter}
        for src, dst in ((creader, uwriter), (ureader, cwriter)):
            task = asyncio.create_task(self._pump(src, dst))
            self._pumps.add(task)
            task.add_done_callback(self._pumps.discard)

    async def _pump(self, src: asyncio.StreamReader, dst: asyncio.StreamWriter) -> None:
        try:
            while data := await src.read(65536):
                dst.write(data)
                await dst.drain()
        except (OSError, asyncio.IncompleteReadError):
            pass
        finally:
            self._writers.discard(dst)
            dst.transport.abort()
