"""core/http/fastapi_adapter.py: the FastAPI internals the hot routes read,
held to the version they were checked against and to what each must answer."""

from __future__ import annotations

from typing import Annotated

import fastapi
from fastapi import APIRouter, Body, FastAPI, Header, Query
from pydantic import BaseModel

from reservo.core.http import fastapi_adapter as fa


def test_the_adapter_was_checked_against_the_installed_fastapi() -> None:
    # On an upgrade: check every function of the adapter against the new
    # version, then move VERIFIED and pyproject.toml's pin together.
    installed = ".".join(fastapi.__version__.split(".")[:2])
    assert installed == fa.VERIFIED, (installed, fa.VERIFIED)


class _Item(BaseModel):
    n: int


def _app() -> FastAPI:
    app, router = FastAPI(), APIRouter()

    @router.get("/things/{thingId}")
    async def thing(
        thing_id: Annotated[int, fastapi.Path(alias="thingId")],
        key: Annotated[str | None, Header(alias="Idempotency-Key")] = None,
        x_trace: Annotated[str | None, Header()] = None,
        tags: Annotated[list[str] | None, Query()] = None,
    ) -> int:
        return thing_id

    @app.post("/items")
    async def item(body: _Item) -> int:
        return body.n

    @app.post("/embedded")
    async def embedded(body: Annotated[_Item, Body(embed=True)]) -> int:
        return body.n

    app.include_router(router, prefix="/api")
    return app


def test_routes_aliases_values_and_bodies_as_the_hot_routes_read_them() -> None:
    routes = {route.path: (route, served) for route, served in fa.api_routes(_app())}
    _, served = routes["/things/{thingId}"]
    # An included router's route is served through its context: the full path.
    assert served.path_regex.match("/api/things/7") is not None
    params = {f.name: f for f in [*served.dependant.path_params, *served.dependant.header_params]}
    assert fa.request_aliases(params["thing_id"]) == ("thingId",)
    assert fa.request_aliases(params["key"]) == ("Idempotency-Key",)
    assert fa.request_aliases(params["x_trace"]) == ("x-trace",)  # underscores converted
    assert fa.is_single_valued(params["key"])
    (tags,) = served.dependant.query_params
    assert not fa.is_single_valued(tags)
    assert isinstance(tags, fa.ModelField) and isinstance(served.dependant, fa.Dependant)
    assert not fa.embeds_body(routes["/items"][1])
    assert fa.embeds_body(routes["/embedded"][1])
