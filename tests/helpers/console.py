"""The operations console over HTTP: signing in with a bearer token."""

from __future__ import annotations

import re

import httpx

from tests.helpers.auth import token


async def signed_in(client: httpx.AsyncClient) -> str:
    """Signs ``client`` in; returns the session's CSRF token."""
    r = await sign_in(client, token("admin", 1))
    assert r.status_code == 303
    page = await client.get("/console/clinic")
    csrf = re.search(r'name="csrf" value="([^"]+)"', page.text)
    assert csrf is not None
    return csrf[1]


async def sign_in(
    client: httpx.AsyncClient, bearer: str, next_: str = "/console"
) -> httpx.Response:
    form = await client.get("/console/sign-in")
    assert form.status_code == 200
    nonce = re.search(r'name="nonce" value="([^"]+)"', form.text)
    assert nonce is not None
    return await client.post(
        "/console/sign-in", data={"token": bearer, "nonce": nonce[1], "next": next_}
    )
