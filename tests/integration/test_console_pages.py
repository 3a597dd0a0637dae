"""The console over HTTP (no browser): sign-in, sessions, CSRF, assets.
The browser journeys are in tests/browser."""

from __future__ import annotations

import re

import httpx

from reservo.console.session import COOKIE, SIGN_IN_COOKIE
from tests.helpers.auth import token
from tests.helpers.console import sign_in


async def test_pages_need_a_session(client: httpx.AsyncClient) -> None:
    for path in ("/console", "/console/overview/panels"):
        r = await client.get(path)
        assert r.status_code == 303
        assert r.headers["location"] == f"/console/sign-in?next={path}"


async def test_an_admin_token_opens_a_session(client: httpx.AsyncClient) -> None:
    r = await sign_in(client, token("admin", 1))
    assert r.status_code == 303 and r.headers["location"] == "/console"
    cookie = r.headers["set-cookie"]
    assert f"{COOKIE}=" in cookie
    assert "HttpOnly" in cookie and "SameSite=strict" in cookie and "Path=/console" in cookie
    page = await client.get("/console")
    assert page.status_code == 200
    assert "<h1>Overview</h1>" in page.text
    assert page.headers["cache-control"] == "no-store"
    assert "frame-ancestors 'none'" in page.headers["content-security-policy"]
    panels = await client.get("/console/overview/panels")
    assert panels.status_code == 200 and 'id="overview-panels"' in panels.text


async def test_other_roles_and_bad_tokens_are_refused(client: httpx.AsyncClient) -> None:
    for role in ("patient", "doctor", "service"):
        r = await sign_in(client, token(role, 5))
        assert r.status_code == 403
        assert f"belongs to a {role}" in r.text
        assert f"{COOKIE}=" not in r.headers.get("set-cookie", "").replace(SIGN_IN_COOKIE, "")
    for bad in (
        "",
        "nonsense",
        token("admin", 1, secret="another-secret-0123456789abcdef-0123456789"),
    ):
        r = await sign_in(client, bad)
        assert r.status_code == 401
        assert "was not accepted" in r.text
    expired = token("admin", 1, ttl_s=-10)
    assert "expired" in (await sign_in(client, expired)).text
    assert (await client.get("/console")).status_code == 303


async def test_sign_in_goes_back_to_console_paths_only(client: httpx.AsyncClient) -> None:
    r = await sign_in(client, token("admin", 1), next_="/console/overview/panels")
    assert r.headers["location"] == "/console/overview/panels"
    for elsewhere in ("//evil.example/console", "https://evil.example", "/api/doctors"):
        r = await sign_in(client, token("admin", 1), next_=elsewhere)
        assert r.headers["location"] == "/console"


async def test_state_changing_posts_need_the_csrf_token(client: httpx.AsyncClient) -> None:
    await sign_in(client, token("admin", 1))
    page = await client.get("/console")
    csrf = re.search(r'name="csrf" value="([^"]+)"', page.text)
    assert csrf is not None
    assert (await client.post("/console/sign-out")).status_code == 403
    assert (await client.post("/console/sign-out", data={"csrf": "x"})).status_code == 403
    wrong_site = await client.post(
        "/console/sign-out", data={"csrf": csrf[1]}, headers={"Origin": "http://evil.example"}
    )
    assert wrong_site.status_code == 403
    assert (await client.get("/console")).status_code == 200  # still signed in
    # The htmx way: the token in a header.
    out = await client.post("/console/sign-out", headers={"X-CSRF-Token": csrf[1]})
    assert out.status_code == 303 and out.headers["location"] == "/console/sign-in"
    assert (await client.get("/console")).status_code == 303


async def test_assets_are_served_by_the_service(client: httpx.AsyncClient) -> None:
    js = await client.get("/console/static/htmx.min.js")
    assert js.status_code == 200 and js.headers["content-type"].startswith("text/javascript")
    assert b"htmx" in js.content
    css = await client.get("/console/static/console.css")
    assert css.status_code == 200 and css.headers["content-type"].startswith("text/css")
    assert (await client.get("/console/static/htmx-LICENSE.txt")).status_code == 200
    assert (await client.get("/console/static/secret.py")).status_code == 404
    assert (await client.get("/console/static/..%2Fsetup.py")).status_code == 404
