"""Issue 22's console rules over HTTP: a signed-out session's cookie is refused
wherever a copy of it turns up, and every day (or time in a cursor) the console
parses follows the API's rule, answered with a 4xx page, never a 500."""

from __future__ import annotations

import re

import httpx
import pytest
from fastapi import FastAPI

from reservo.console.session import COOKIE
from reservo.core.http.pagination import encode_cursor
from reservo.core.http.schemas import MAX_ID
from tests.helpers.appointments import book, make_slots
from tests.helpers.auth import ADMIN, new_id, token
from tests.helpers.console import sign_in


def _app(client: httpx.AsyncClient) -> FastAPI:
    transport = client._transport
    assert isinstance(transport, httpx.ASGITransport)
    app = transport.app
    assert isinstance(app, FastAPI)
    return app


async def _session(client: httpx.AsyncClient) -> tuple[str, str]:
    """Signs ``client`` in: (the session cookie's value, the session's CSRF token)."""
    r = await sign_in(client, token("admin", 1))
    assert r.status_code == 303, r.text
    page = await client.get("/console")
    csrf = re.search(r'name="csrf" value="([^"]+)"', page.text)
    assert page.status_code == 200 and csrf is not None
    return r.cookies[COOKIE], csrf[1]


# -- sign-out ----------------------------------------------------------------------------


async def test_a_signed_out_cookie_is_refused(client: httpx.AsyncClient) -> None:
    cookie, csrf = await _session(client)
    transport = httpx.ASGITransport(app=_app(client))
    async with (
        httpx.AsyncClient(transport=transport, base_url="http://reservo.test") as copy,
        httpx.AsyncClient(transport=transport, base_url="http://reservo.test") as other,
    ):
        copy.cookies.set(COOKIE, cookie, path="/console")  # a copy of the cookie
        other_cookie, _ = await _session(other)  # the same admin, another session
        assert (await copy.get("/console")).status_code == 200
        out = await client.post("/console/sign-out", data={"csrf": csrf})
        assert out.status_code == 303 and out.headers["location"] == "/console/sign-in"
        # The copy no longer opens anything, GET, htmx or POST.
        for path in ("/console", "/console/clinic", "/console/jobs"):
            r = await copy.get(path)
            assert r.status_code == 303, path
            assert r.headers["location"].startswith("/console/sign-in"), path
        r = await copy.get("/console/overview/panels", headers={"HX-Request": "true"})
        assert r.status_code == 401
        r = await copy.post("/console/sign-out", data={"csrf": csrf})
        assert r.status_code == 303 and r.headers["location"] == "/console/sign-in?next=/console"
        # Signing out ends that session only.
        assert (await other.get("/console")).status_code == 200
        assert other.cookies[COOKIE] == other_cookie
        # Signing in again opens a new session.
        await _session(copy)
        assert (await copy.get("/console")).status_code == 200


# -- days ---------------------------------------------------------------------------------

BAD_DAYS = [
    "9999-12-31",  # was a 500
    "0001-01-01",
    "1999-12-31",  # accepted, though the API refuses it
    "2100-01-01",
    "2026-02-30",
    "20260501",  # date.fromisoformat takes these
    "2026-W18-5",
    "2026-05-01T00:00",
    " 2026-05-01",
    "\uff12\uff10\uff12\uff16-05-01",  # fullwidth digits
    "",
    "x" * 100,
]


def _refused_page(r: httpx.Response, path: str) -> None:
    assert r.status_code == 422, (path, r.status_code, r.text[:300])
    assert r.headers["content-type"].startswith("text/html"), path
    assert 'role="alert"' in r.text, path


@pytest.mark.parametrize("day", BAD_DAYS)
async def test_the_console_takes_only_the_apis_days(client: httpx.AsyncClient, day: str) -> None:
    await _session(client)
    for path, params in (
        ("/console/clinic", {"day": day}),
        ("/console/clinic", {"doctor": "1", "day": day}),
        ("/console/rentals", {"day": day}),
        ("/console/rentals", {"car": "1", "day": day, "days": "7"}),
    ):
        _refused_page(await client.get(path, params=params), f"{path} {params}")


async def test_the_first_and_last_days_are_served(client: httpx.AsyncClient) -> None:
    await _session(client)
    for day in ("2000-01-01", "2099-12-31"):
        r = await client.get("/console/clinic", params={"doctor": "987654321", "day": day})
        assert r.status_code == 404 and day in r.text  # no such doctor; the day is fine
    r = await client.get("/console/rentals", params={"day": "2000-01-01", "days": "31"})
    assert r.status_code == 200
    r = await client.get("/console/rentals", params={"day": "2099-12-25", "days": "7"})
    assert r.status_code == 200
    # A window ending after the last accepted day is refused, not read.
    r = await client.get("/console/rentals", params={"day": "2099-12-26", "days": "7"})
    _refused_page(r, "window past 2100")


async def test_a_bad_day_on_the_cancel_pages_changes_nothing(client: httpx.AsyncClient) -> None:
    _, csrf = await _session(client)
    _, slots = await make_slots(client)
    booked = await book(client, slots[0]["id"], new_id())
    assert booked.status_code == 201, booked.text
    appt = booked.json()["id"]
    path = f"/console/clinic/appointments/{appt}/cancel"
    _refused_page(await client.get(path, params={"day": "9999-12-31"}), "cancel page")
    for day in ("9999-12-31", "1999-12-31", "20260501"):
        r = await client.post(path, data={"csrf": csrf, "day": day})
        _refused_page(r, f"cancel {day}")
        got = await client.get(f"/api/appointments/{appt}", headers=ADMIN)
        assert got.json()["status"] == "BOOKED", day
    day = slots[0]["startAt"][:10]
    r = await client.post(path, data={"csrf": csrf, "day": day})
    assert r.status_code == 303 and r.headers["location"].endswith(f"day={day}")
    got = await client.get(f"/api/appointments/{appt}", headers=ADMIN)
    assert got.json()["status"] == "CANCELLED"


@pytest.mark.parametrize("us", [MAX_ID, 1, 4_102_444_800_000_000])
async def test_a_cursor_time_outside_the_range_is_a_422_page(
    client: httpx.AsyncClient, us: int
) -> None:
    """A cursor is a time and an id: a time no row can have is no cursor of ours
    (year 294,000 was a 500 on the console's lists)."""
    await _session(client)
    after = encode_cursor(us, 1)
    for path, params in (
        ("/console/rentals/bookings", {"customer": "5", "after": after}),
        ("/console/betting", {"status": "SETTLED", "after": after}),
    ):
        r = await client.get(path, params=params)
        _refused_page(r, path)
        assert "malformed cursor" in r.text
