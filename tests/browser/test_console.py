"""The console's main journeys in a real headless Chromium: signing in, the
overview following a booking made through the API and the agenda cancelling
it, and the refusals (no session, a non-admin token, forged form posts)."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

from tests.helpers.auth import ADMIN, new_id, token
from tests.helpers.browser import Live, booked_slot, sign_in

SESSION_COOKIE = "reservo_console"


async def session_cookie(page: Any) -> dict[str, Any] | None:
    cookies = await page.context.cookies()
    return next((c for c in cookies if c["name"] == SESSION_COOKIE), None)


async def test_a_page_without_a_session_redirects_to_sign_in(page: Any, live: Live) -> None:
    r = await live.http.get("/console")
    assert r.status_code == 303
    assert r.headers["location"] == "/console/sign-in?next=/console"
    fragment = await live.http.get("/console/overview/panels", headers={"HX-Request": "true"})
    assert fragment.status_code == 401
    assert fragment.headers["hx-redirect"] == "/console/sign-in"

    await page.goto(f"{live.url}/console")
    assert page.url == f"{live.url}/console/sign-in?next=/console"
    assert await page.locator("h1").inner_text() == "Sign in"


async def test_an_admin_signs_in_with_a_token_and_gets_a_session_cookie(
    page: Any, live: Live, tmp_path: Path
) -> None:
    await sign_in(page, live)
    assert page.url == f"{live.url}/console"
    assert await page.locator("h1").inner_text() == "Overview"
    health = page.locator(".health")
    assert "PostgreSQL: OK" in await health.inner_text()
    assert "Redis: OK" in await health.inner_text()

    cookie = await session_cookie(page)
    assert cookie is not None
    assert cookie["httpOnly"] is True
    assert cookie["sameSite"] == "Strict"
    assert cookie["path"] == "/console"
    # The cookie is the console's own: no bearer token for the API, no secret.
    secret = live.container.settings.jwt_secret
    assert secret not in cookie["value"] and secret not in await page.content()
    as_bearer = await live.http.get(
        "/api/ops/dead-letters", headers={"Authorization": f"Bearer {cookie['value']}"}
    )
    assert as_bearer.status_code == 401

    # On a phone the page fits the screen's width (the grid wraps, nothing scrolls sideways).
    await page.set_viewport_size({"width": 390, "height": 844})
    await page.reload()
    assert await page.evaluate("document.documentElement.scrollWidth") <= 390
    await page.screenshot(path=str(tmp_path / "phone.png"), full_page=True)

    # Signing out (a CSRF-protected form) ends the session.
    await page.click("form.sign-out button")
    await page.wait_for_url(re.compile(r".*/console/sign-in$"))
    assert await session_cookie(page) is None
    await page.goto(f"{live.url}/console")
    assert "/console/sign-in" in page.url


async def test_a_patient_token_is_refused_with_a_clear_message(page: Any, live: Live) -> None:
    await sign_in(page, live, role="patient", sub=new_id())
    assert "/console/sign-in" in page.url
    alert = await page.locator("[role=alert]").inner_text()
    assert "belongs to a patient" in alert and "admins only" in alert
    assert await session_cookie(page) is None

    await page.fill("#token", "not-a-jwt")
    await page.click("form[action='/console/sign-in'] button")
    assert "was not accepted" in await page.locator("[role=alert]").inner_text()
    assert await session_cookie(page) is None


async def test_the_overview_shows_a_booking_made_through_the_api(page: Any, live: Live) -> None:
    await sign_in(page, live)
    booked = page.locator("#chart-booked .total")
    before = int(await booked.inner_text())

    http = live.http
    doctor_id, day, slot_id, appointment_id = await booked_slot(live, "Dr. Console", "10:00")

    # No reload: the panels refresh themselves (htmx) and show it.
    row = page.locator("#latest-appointments tr", has_text=str(appointment_id))
    await row.first.wait_for(timeout=15_000)
    assert "BOOKED" in await row.first.inner_text()
    await page.wait_for_function(
        "([sel, before]) => Number(document.querySelector(sel).textContent) > before",
        arg=["#chart-booked .total", before],
        timeout=15_000,
    )

    # From the agenda: the slot's seats, then Cancel, confirmed on its own page.
    await page.click("nav a[href='/console/clinic']")
    await page.fill("#doctor", str(doctor_id))
    await page.fill("#day", day.isoformat())
    await page.click("form.picker button")
    slot = page.locator(f"#slot-{slot_id}")
    assert "1/1 seats booked" in await slot.locator(".seats").inner_text()
    await slot.locator(f"#appointment-{appointment_id} a.action").click()
    assert await page.locator("h1").inner_text() == f"Cancel appointment {appointment_id}?"
    await page.click("button.danger")
    await page.wait_for_url(re.compile(r".*/console/clinic\?doctor=.*"))
    assert "0/1 seats booked" in await slot.locator(".seats").inner_text()
    assert "CANCELLED" in await slot.locator(f"#appointment-{appointment_id}").inner_text()
    # The API agrees: the appointment is cancelled and the seat is free again.
    got = await http.get(f"/api/appointments/{appointment_id}", headers=ADMIN)
    assert got.json()["status"] == "CANCELLED"
    agenda = await http.get(
        f"/api/doctors/{doctor_id}/agenda", params={"date": day.isoformat()}, headers=ADMIN
    )
    seats = {s["id"]: s["bookedCount"] for s in agenda.json()["slots"]}
    assert seats[slot_id] == 0


async def test_forged_form_posts_are_refused_and_change_nothing(page: Any, live: Live) -> None:
    await sign_in(page, live)
    signed_in = await session_cookie(page)
    assert signed_in is not None

    # With the session cookie but a wrong or missing CSRF token: 403, still signed in.
    for form in ({"csrf": "forged"}, {}):
        r = await page.request.post(f"{live.url}/console/sign-out", form=form, max_redirects=0)
        assert r.status == 403, await r.text()
    # The right token from another site (the Origin says so): 403 too.
    csrf = await page.locator("form.sign-out input[name=csrf]").get_attribute("value")
    r = await page.request.post(
        f"{live.url}/console/sign-out",
        form={"csrf": csrf},
        headers={"Origin": "https://evil.example"},
        max_redirects=0,
    )
    assert r.status == 403
    assert await session_cookie(page) == signed_in
    await page.reload()
    assert await page.locator("h1").inner_text() == "Overview"

    # No session at all: sent to sign in, nothing done.
    r2 = await live.http.post("/console/sign-out", data={"csrf": csrf})
    assert r2.status_code == 303
    assert r2.headers["location"].startswith("/console/sign-in")
    assert "set-cookie" not in r2.headers

    # A sign-in post that did not come from the sign-in page (no form cookie): no session.
    r3 = await live.http.post(
        "/console/sign-in", data={"token": token("admin", 1), "nonce": "guess"}
    )
    assert r3.status_code == 403
    assert SESSION_COOKIE not in r3.cookies
