"""The request body limit (RESERVO_MAX_BODY_BYTES): a concern of the request
pipeline (core/http/pipeline.py), so every route, hot or not, is behind it."""

from __future__ import annotations

import orjson
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from reservo.core.kernel.errors import PROBLEM_JSON, problem_body


class BodyTooLarge(Exception):
    """Raised into the app from ``receive`` once a body passes the limit."""


class LimitRequestBody:
    """Refuses request bodies over ``max_bytes`` with 413, before any of it is
    read and before authentication: a declared Content-Length over the limit is
    answered at once; an unsized (chunked) body is counted while it streams and
    cut off as soon as it passes the limit. Without this, every route read
    whatever size it was sent into memory."""

    def __init__(self, app: ASGIApp, max_bytes: int) -> None:
        self.app = app
        self.max_bytes = max_bytes

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        limit = self.max_bytes
        lengths, streamed = 0, False
        for name, value in scope["headers"]:
            if name == b"transfer-encoding":
                streamed = True
            elif name == b"content-length":
                # A malformed Content-Length is the server's to refuse; the stream
                # count below still applies. (Length before int(): int() refuses
                # thousands of digits by raising.)
                if not value.isdigit():
                    streamed = True
                    continue
                digits = value.lstrip(b"0")
                if len(digits) > 18 or int(digits or b"0") > limit:
                    await _send_too_large(send, limit)
                    return
                lengths += 1
        if not streamed and lengths <= 1:
            # The server frames this body by its one Content-Length (within the
            # limit), or it has none (empty): it cannot pass the limit, and is
            # not counted (two closures per request, most of this step's cost).
            await self.app(scope, receive, send)
            return
        received = 0
        over = started = False

        async def limited_receive() -> Message:
            nonlocal received, over
            message = await receive()
            if message["type"] == "http.request":
                received += len(message.get("body", b""))
                if received > limit:
                    over = True
                    raise BodyTooLarge
            return message

        async def guarded_send(message: Message) -> None:
            nonlocal started
            if over and not started:
                # Whatever the app answers to its cut-off body (FastAPI turns a
                # failing read into a 400) is replaced by the 413 below.
                return
            if message["type"] == "http.response.start":
                started = True
            await send(message)

        try:
            await self.app(scope, limited_receive, guarded_send)
        except Exception:
            if not over or started:
                raise
        if over and not started:
            await _send_too_large(send, limit)


async def _send_too_large(send: Send, limit: int) -> None:
    body = orjson.dumps(
        problem_body(413, "payload_too_large", f"the request body is larger than {limit} bytes")
    )
    await send(
        {
            "type": "http.response.start",
            "status": 413,
            "headers": [
                (b"content-type", PROBLEM_JSON.encode()),
                (b"content-length", str(len(body)).encode()),
                # The rest of the body is never read: the connection cannot be reused.
                (b"connection", b"close"),
            ],
        }
    )
    await send({"type": "http.response.body", "body": body})
