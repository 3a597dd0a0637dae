"""Regression found by the chaos suite (PostgreSQL restarted under load): a
request answered 500 ``internal_error`` instead of 503 ``unavailable``.

When PostgreSQL shuts down (fast mode, or a backend terminated) it sends each
session a FATAL ErrorResponse and then closes the socket. If the FATAL reaches
asyncpg while the connection is between two statements (idle in the pool, or
inside a transaction before its COMMIT) and the close has not been processed yet,
asyncpg's protocol is left consuming that error, and the next statement fails with
``InternalClientError: cannot switch to state ...; another operation (2) is in
progress`` before anything is sent: nothing was written, the connection is dead,
and the request must be retried, exactly as for a refused connection.

Here a proxy between the pool and PostgreSQL widens that window: it forwards the
FATAL at once and holds the close back. Not marked ``chaos``: it is quick and runs
with the rest of the suite."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from urllib.parse import urlsplit, urlunsplit

import asyncpg
import httpx

from reservo.app import create_app
from reservo.bootstrap import build
from reservo.core.kernel.clock import OffsetClock
from reservo.settings import Settings
from tests.helpers.appointments import book, make_slots
from tests.helpers.auth import new_id


class LingeringProxy:
    """Forwards a local port to PostgreSQL. While ``linger`` is set, a connection
    the server closed stays open on the client side (its last bytes, the FATAL,
    are delivered) until ``release()``."""

    def __init__(self, upstream: tuple[str, int]) -> None:
        self.upstream = upstream
        self.port = 0
        self.linger = False
        self.server_ports: list[int] = []  # our side of each upstream connection
        self.server_closed = asyncio.Event()
        self._released = asyncio.Event()
        self._server: asyncio.Server | None = None
        self._tasks: set[asyncio.Task[None]] = set()

    async def start(self) -> None:
        self._server = await asyncio.start_server(self._serve, "127.0.0.1", 0)
        self.port = int(self._server.sockets[0].getsockname()[1])

    def release(self) -> None:
        self._released.set()

    async def stop(self) -> None:
        self.release()
        if self._server is not None:
            self._server.close()
        for task in list(self._tasks):
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)

    async def _serve(self, creader: asyncio.StreamReader, cwriter: asyncio.StreamWriter) -> None:
        ureader, uwriter = await asyncio.open_connection(*self.upstream)
        self.server_ports.append(int(uwriter.get_extra_info("sockname")[1]))
        for task in (
            asyncio.create_task(self._pump(creader, uwriter, from_server=False)),
            asyncio.create_task(self._pump(ureader, cwriter, from_server=True)),
        ):
            self._tasks.add(task)
            task.add_done_callback(self._tasks.discard)

    async def _pump(
        self, src: asyncio.StreamReader, dst: asyncio.StreamWriter, *, from_server: bool
    ) -> None:
        try:
            while data := await src.read(65536):
                dst.write(data)
                await dst.drain()
            if from_server and self.linger:
                self.server_closed.set()
                await self._released.wait()
        except OSError:
            pass
        finally:
            dst.transport.abort()


def _via(url: str, port: int) -> str:
    parts = urlsplit(url)
    userinfo = parts.netloc.rpartition("@")[0]
    return urlunsplit(parts._replace(netloc=f"{userinfo}@127.0.0.1:{port}"))


@contextlib.asynccontextmanager
async def _client(settings: Settings) -> AsyncIterator[httpx.AsyncClient]:
    container = build(settings, OffsetClock())
    try:
        app = create_app(container, owns_container=False)
        async with httpx.AsyncClient(
            transport=httpx.ASGITransport(app=app), base_url="http://reservo.test"
        ) as client:
            yield client
    finally:
        await container.close()


async def test_a_fatal_before_the_close_answers_503_and_the_retry_books(
    base_settings: Settings, database_url: str
) -> None:
    pg = urlsplit(database_url)
    proxy = LingeringProxy((pg.hostname or "127.0.0.1", pg.port or 5432))
    await proxy.start()
    # One pooled connection: the request below gets the one the server killed.
    settings = base_settings.with_(
        database_url=_via(database_url, proxy.port),
        db_pool_min=1,
        db_pool_max=1,
        db_acquire_timeout_s=2.0,
    )
    admin = await asyncpg.connect(database_url)
    try:
        async with _client(settings) as client:
            _, slots = await make_slots(client)
            proxy.linger = True
            killed = await admin.fetchval(
                "SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity "
                "WHERE client_port = ANY($1::int[])",
                proxy.server_ports,
            )
            assert killed >= 1
            await asyncio.wait_for(proxy.server_closed.wait(), 10)
            await asyncio.sleep(0.2)  # the FATAL reached asyncpg; the close did not

            patient, key = new_id(), f"fatal-{new_id()}"
            r = await book(client, slots[0]["id"], patient, key)
            assert r.status_code == 503, r.text
            assert r.json()["code"] == "unavailable"
            assert r.headers["Retry-After"] == "1"

            # The broken connection was dropped: the client's retry (same key, after
            # the Retry-After it was given) books.
            proxy.release()
            await asyncio.sleep(float(r.headers["Retry-After"]))
            r = await book(client, slots[0]["id"], patient, key)
            assert r.status_code == 201, r.text
            assert r.json()["patientId"] == patient
    finally:
        await admin.close()
        await proxy.stop()
