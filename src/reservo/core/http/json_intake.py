"""JSON intake: every JSON body is read by core.http.schemas.read_json before a
route sees it (a concern of the request pipeline, core/http/pipeline.py)."""

from __future__ import annotations

from starlette.types import ASGIApp, Message, Receive, Scope, Send

from reservo.core.http.methods import routed
from reservo.core.http.problems import problem
from reservo.core.http.schemas import DuplicateKey, JsonRefused, read_json
from reservo.core.kernel.errors import DomainError, validation_error

# Where the intake leaves the document it read from a request's JSON body.
JSON_DOCUMENT = "reservo.json_document"


def is_json(scope: Scope) -> bool:
    """Whether the request declares a JSON body, as FastAPI decides to parse one
    (``application/json`` or ``application/*+json``, any parameters)."""
    for name, value in scope["headers"]:
        if name == b"content-type":
            return is_json_media(value)
    return False


def is_json_media(value: bytes | None) -> bool:
    """``is_json`` of a Content-Type header's raw value (None: no header)."""
    if value is None:
        return False
    media = value.split(b";", 1)[0].strip().lower()
    return media == b"application/json" or (
        media.startswith(b"application/") and media.endswith(b"+json")
    )


class StrictJson:
    """Refuses a JSON body that breaks the intake rules (core.http.schemas.read_json)
    with 422 ``validation_error``, before any route runs. FastAPI's own reader
    (the standard library's) takes lone UTF-16 surrogates, NaN and integers of
    any size, and a route whose field is free-form (a job's payload) passed them
    on, to fail later as a 500. The body is read whole here, as the route would
    read it, and handed on unchanged. A request no route takes (404, 405) or one
    without credentials (401) gets that answer, as with any body."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or not is_json(scope):
            await self.app(scope, receive, send)
            return
        messages: list[Message] = []
        while True:
            message = await receive()
            messages.append(message)
            if message["type"] != "http.request" or not message.get("more_body", False):
                break
        if messages[-1]["type"] == "http.request":  # whole (else the client left)
            body = b"".join(m.get("body", b"") for m in messages)
            refusal = None
            if body:
                try:
                    # Kept for the route: a hot one reads it instead of the body.
                    scope[JSON_DOCUMENT] = read_json(body)
                except JsonRefused as exc:
                    refusal = problem(refused_json(exc))
            if refusal is not None and routed(scope):
                if _credentialed(scope):
                    await refusal(scope, receive, send)
                    return
                # The route refuses it (401) before using the body, which its
                # own reader must not see either (undecodable bytes are a 400).
                messages = [{"type": "http.request", "body": b"", "more_body": False}]
        await self.app(scope, _replaying(messages, receive), send)


_CREDENTIALS = frozenset((b"authorization", b"x-signature"))


def _credentialed(scope: Scope) -> bool:
    """Whether a refused body is ours to answer: an /api/ request with no token
    and no signature is the route's to refuse first (401, as for any body:
    every /api/ route with a body needs one, and checks it before its body is
    used), not a 422 about a body nobody may send."""
    path: str = scope.get("path", "")
    return not path.startswith("/api/") or any(n in _CREDENTIALS for n, _ in scope["headers"])


def refused_json(exc: JsonRefused) -> DomainError:
    """The 422 of a body read_json refuses: ``duplicate_key`` for a key named
    twice in one object (its own code: a client that merges objects by hand
    must learn that it sent two values, not that a value was wrong), else
    ``validation_error``; ``errors[0].loc`` is ``["body"]`` either way."""
    if isinstance(exc, DuplicateKey):
        error = {"loc": ["body"], "msg": str(exc), "type": "duplicate_key"}
        return validation_error(
            "the request body names a key twice in one object", [error], code="duplicate_key"
        )
    error = {"loc": ["body"], "msg": str(exc), "type": "json_invalid"}
    return validation_error("the request body is not acceptable JSON", [error])


def check_json(body: bytes) -> None:
    """Raises ``refused_json``'s 422 when ``body`` is not JSON read_json reads:
    for a route that reads its body raw (a signed webhook, whose signature
    covers the bytes), whatever Content-Type it was sent with."""
    try:
        read_json(body)
    except JsonRefused as exc:
        raise refused_json(exc) from None


def _replaying(messages: list[Message], receive: Receive) -> Receive:
    """A receive that hands out ``messages`` again, then waits as before."""
    pending = list(messages)

    async def replay() -> Message:
        if pending:
            return pending.pop(0)
        return await receive()

    return replay
