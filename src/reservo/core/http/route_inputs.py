"""What a route declares it takes besides its body: ids in paths, and the
services the app keeps on ``app.state``."""

from __future__ import annotations

from collections.abc import Callable
from typing import Annotated, TypeVar, cast

from fastapi import Path, Request

from reservo.core.http.schemas import MAX_ID

T = TypeVar("T")
# An id in a path (`Annotated[PathId, Path(alias="bookingId")]`): one name per
# collection on every route (`{bookingId}`, never `{id}`), so a generated client
# has one parameter name for one thing.
PathId = Annotated[int, Path(ge=1, le=MAX_ID)]


def from_state(kind: type[T], name: str) -> Callable[[Request], T]:
    """The getter of what the app keeps on ``app.state`` under ``name`` (a
    module's ``state``, set by the app at start): ``_svc = from_state(X, "x")``."""

    def get(request: Request) -> T:
        return cast(T, getattr(request.app.state, name))

    return get
