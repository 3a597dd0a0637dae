"""The rules the contract's linters check (tests/e2e/test_contract_lint.py), held
by the document's build itself: a route added without a description or under an
undeclared tag fails here, in a fast test, with a message that says what to do."""

from __future__ import annotations

from typing import Annotated, Any

import pytest
from fastapi import FastAPI, Header

from reservo.app import TAGS, openapi_document
from reservo.core.http.openapi import SIGNATURE, finish

DECLARED = [{"name": "things", "description": "Things."}]


def _doc(app: FastAPI) -> dict[str, Any]:
    return finish(FastAPI.openapi(app), app.routes, "/api/")


def _app(tags: list[dict[str, str]] = DECLARED) -> FastAPI:
    return FastAPI(openapi_tags=tags)


def test_an_operation_without_a_description_is_refused() -> None:
    app = _app()

    @app.get("/api/things", tags=["things"], operation_id="listThings")
    async def list_things() -> list[str]:
        return []

    with pytest.raises(ValueError, match=r"'listThings' \(GET /api/things\) needs a description"):
        _doc(app)


def test_an_operation_under_an_undeclared_tag_is_refused() -> None:
    app = _app()

    @app.get("/api/others", tags=["others"], operation_id="listOthers")
    async def list_others() -> list[str]:
        """Every other."""
        return []

    with pytest.raises(ValueError, match=r"tag\(s\) \['others'\] the document does not declare"):
        _doc(app)


def test_an_untagged_operation_is_refused() -> None:
    app = _app()

    @app.get("/api/things", operation_id="listThings")
    async def list_things() -> list[str]:
        """Every thing."""
        return []

    with pytest.raises(ValueError, match=r"'listThings' \(GET /api/things\) has no tag"):
        _doc(app)


def test_a_tag_without_a_description_is_refused() -> None:
    app = _app([{"name": "things"}])

    @app.get("/api/things", tags=["things"], operation_id="listThings")
    async def list_things() -> list[str]:
        """Every thing."""
        return []

    with pytest.raises(ValueError, match="tag 'things' needs a description"):
        _doc(app)


def test_every_operation_states_its_security() -> None:
    app = _app()

    @app.get("/livez", tags=["things"], operation_id="getLiveness")
    async def livez() -> str:
        """Public."""
        return "ok"

    @app.post("/api/hook", tags=["things"], operation_id="receiveHook")
    async def hook(sig: Annotated[str | None, Header(alias="X-Signature")] = None) -> str:
        """Signed."""
        return "ok"

    paths = _doc(app)["paths"]
    assert paths["/livez"]["get"]["security"] == []
    assert paths["/api/hook"]["post"]["security"] == [{SIGNATURE: []}]


def test_the_service_document_declares_each_tag_it_uses_and_no_other() -> None:
    doc = openapi_document()  # builds only if every operation passes the rules above
    used = {t for ops in doc["paths"].values() for op in ops.values() for t in op["tags"]}
    assert used == {t["name"] for t in TAGS}
    assert doc["servers"] == [{"url": "/", "description": "This service, where it is deployed"}]
