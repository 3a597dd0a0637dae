"""The request deadline (core/http/deadline.py) on plain ASGI apps: a request
that has not begun its response in time is answered 503 at the deadline, even
while its handler is still unwinding; the client's body time is not counted; a
started response is never cut; a fast request is untouched."""

from __future__ import annotations

import asyncio
import time

import orjson
from starlette.types import Message, Receive, Scope, Send

from reservo.core.http.deadline import Deadlines, within_deadline

SCOPE: Scope = {"type": "http", "method": "POST", "path": "/api/x", "headers": []}


class Client:
    """The server's side of one request: what the app sends, and when."""

    def __init__(self, body_after_s: float = 0.0) -> None:
        self.t0 = time.monotonic()
        self.sent: list[tuple[float, Message]] = []
        self.body_after_s = body_after_s

    async def receive(self) -> Message:
        await asyncio.sleep(self.body_after_s)
        return {"type": "http.request", "body": b"{}", "more_body": False}

    async def send(self, message: Message) -> None:
        self.sent.append((time.monotonic() - self.t0, message))

    def status(self) -> tuple[float, int]:
        at, start = next((t, m) for t, m in self.sent if m["type"] == "http.response.start")
        return at, int(start["status"])

    def body(self) -> bytes:
        return b"".join(
            m.get("body", b"") for _, m in self.sent if m["type"] == "http.response.body"
        )


async def answer(send: Send, status: int = 200, body: bytes = b"ok") -> None:
    await send({"type": "http.response.start", "status": status, "headers": []})
    await send({"type": "http.response.body", "body": body})


async def test_a_slow_handler_is_answered_503_at_the_deadline_and_cancelled() -> None:
    cancelled = asyncio.Event()

    async def app(scope: Scope, receive: Receive, send: Send) -> None:
        try:
            await asyncio.sleep(10)
        except asyncio.CancelledError:
            cancelled.set()
            raise
        await answer(send)

    client = Client()
    await within_deadline(app, 0.2, SCOPE, client.receive, client.send)
    at, status = client.status()
    assert status == 503 and 0.2 <= at < 0.5
    assert orjson.loads(client.body())["code"] == "unavailable"
    headers = dict(client.sent[0][1]["headers"])
    assert headers[b"retry-after"] == b"1"
    assert cancelled.is_set()
    assert asyncio.current_task().cancelling() == 0  # type: ignore[union-attr]


async def test_the_503_does_not_wait_for_the_handler_to_unwind() -> None:
    """A cancelled statement's cleanup needs the slow network (asyncpg waits for
    the server to confirm the cancel, then rolls back): the client has its 503
    before it ends, and what the handler sends afterwards is dropped."""

    async def app(scope: Scope, receive: Receive, send: Send) -> None:
        try:
            await asyncio.sleep(10)
        finally:
            await asyncio.sleep(0.5)  # the rollback's round trips
            await answer(send, 500, b"late")

    client = Client()
    await within_deadline(app, 0.2, SCOPE, client.receive, client.send)
    at, status = client.status()
    assert status == 503 and at < 0.5
    assert [m["type"] for _, m in client.sent] == ["http.response.start", "http.response.body"]
    assert b"late" not in client.body()


async def test_cleanup_that_turns_the_cancel_into_an_error_still_answers_503() -> None:
    """asyncpg's ROLLBACK after a cancelled statement can raise InterfaceError
    in place of the CancelledError: the request is still over, as a 503."""

    async def app(scope: Scope, receive: Receive, send: Send) -> None:
        try:
            await asyncio.sleep(10)
        except asyncio.CancelledError:
            raise RuntimeError("another operation is in progress") from None

    client = Client()
    await within_deadline(app, 0.1, SCOPE, client.receive, client.send)
    assert client.status()[1] == 503
    assert asyncio.current_task().cancelling() == 0  # type: ignore[union-attr]


async def test_the_wait_for_the_clients_body_does_not_count() -> None:
    async def app(scope: Scope, receive: Receive, send: Send) -> None:
        await receive()  # the client takes 0.4 s to send it
        await asyncio.sleep(0.1)
        await answer(send)

    client = Client(body_after_s=0.4)
    await within_deadline(app, 0.25, SCOPE, client.receive, client.send)
    assert client.status()[1] == 200


async def test_a_started_response_is_not_cut_and_a_fast_one_untouched() -> None:
    async def streaming(scope: Scope, receive: Receive, send: Send) -> None:
        await send({"type": "http.response.start", "status": 200, "headers": []})
        for part in (b"a", b"b", b"c"):
            await asyncio.sleep(0.1)
            await send({"type": "http.response.body", "body": part, "more_body": True})
        await send({"type": "http.response.body", "body": b""})

    client = Client()
    await within_deadline(streaming, 0.15, SCOPE, client.receive, client.send)
    assert client.status()[1] == 200 and client.body() == b"abc"

    async def fast(scope: Scope, receive: Receive, send: Send) -> None:
        await answer(send, 201, b"made")

    client = Client()
    await within_deadline(fast, 0.15, SCOPE, client.receive, client.send)
    assert client.status()[1] == 201 and client.body() == b"made"
    await asyncio.sleep(0.2)  # the timer is gone: nothing else is sent
    assert len(client.sent) == 2


async def test_an_error_of_the_handler_before_the_deadline_is_its_own() -> None:
    async def app(scope: Scope, receive: Receive, send: Send) -> None:
        raise TimeoutError("the handler's own")

    client = Client()
    try:
        await within_deadline(app, 1.0, SCOPE, client.receive, client.send)
    except TimeoutError as exc:
        assert str(exc) == "the handler's own"
    else:
        raise AssertionError("the handler's error was swallowed")
    assert client.sent == []


async def test_one_sweep_serves_many_requests_and_stops_when_none_is_in_flight() -> None:
    deadlines = Deadlines(0.2)

    async def app(scope: Scope, receive: Receive, send: Send) -> None:
        await asyncio.sleep(float(scope["path"].rsplit("/", 1)[1]))
        await answer(send)

    clients = {path: Client() for path in ("/a/0.05", "/b/1", "/c/0.1", "/d/2")}
    await asyncio.gather(
        *(
            deadlines.run(app, {**SCOPE, "path": path}, c.receive, c.send)
            for path, c in clients.items()
        )
    )
    assert {path: c.status()[1] for path, c in clients.items()} == {
        "/a/0.05": 200,
        "/b/1": 503,
        "/c/0.1": 200,
        "/d/2": 503,
    }
    assert all(c.status()[0] < 0.4 for c in clients.values())
    await asyncio.sleep(0.2)
    assert deadlines._sweep is None  # no timer left while nothing is in flight
