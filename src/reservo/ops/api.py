"""HTTP routes of the Operations API: dead letters, listed and replayed (admin)."""

from __future__ import annotations

from dataclasses import asdict
from typing import Annotated

from fastapi import APIRouter, Path, Query, Request
from fastapi.responses import JSONResponse

from reservo.core.http.callers import AdminCaller
from reservo.core.http.openapi import raises
from reservo.core.http.pagination import DEFAULT_LIMIT, After, Limit, decode_cursor, page
from reservo.core.http.responses import json_response
from reservo.core.http.route_inputs import PathId, from_state
from reservo.core.messaging.deadletters import DeadLetter, DeadLetterBox
from reservo.ops.schemas import DeadLetterOut, DeadLetterPage, Replayed

router = APIRouter(prefix="/api/ops", tags=["operations"])


_box = from_state(DeadLetterBox, "dead_letters")


def render(d: DeadLetter) -> DeadLetterOut:
    return DeadLetterOut(**asdict(d))


@router.get(
    "/dead-letters",
    response_model=DeadLetterPage,
    operation_id="listDeadLetters",
    openapi_extra=raises(),
)
async def list_dead_letters(
    caller: AdminCaller,
    request: Request,
    consumer: Annotated[str | None, Query(min_length=1, max_length=200)] = None,
    limit: Limit = DEFAULT_LIMIT,
    after: After = None,
) -> JSONResponse:
    """Events consumers rejected, newest first, replayed ones included (`replayedAt`)."""
    before = decode_cursor(after, int)[0] if after is not None else None
    letters = await _box(request).page(consumer, before, limit + 1)
    items, nxt = page(letters, limit, lambda d: d.id)
    body = DeadLetterPage(items=[render(d) for d in items], next=nxt)
    return json_response(200, body.wire())


@router.post(
    "/dead-letters/{deadLetterId}/replay",
    response_model=Replayed,
    operation_id="replayDeadLetter",
    openapi_extra=raises("not_found", "not_replayable"),
)
async def replay_dead_letter(
    letter_id: Annotated[PathId, Path(alias="deadLetterId")], caller: AdminCaller, request: Request
) -> JSONResponse:
    """Deliver the event again to the consumer that parked it; it is applied at
    most once (the consumer dedupes by event id), so replaying twice is harmless."""
    await _box(request).replay(letter_id)
    return json_response(200, Replayed(replayed=True).wire())
