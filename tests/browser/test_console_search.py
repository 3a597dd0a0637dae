"""Finding things by name in a real headless Chromium: from the overview's Find
form to a doctor's day (on the doctor's today), a car's calendar from the
Rentals page, a match from the Betting page, and a patient by e-mail to their
appointments; on a phone's width too. The HTTP-level rules are in
tests/integration/test_console_search.py."""

from __future__ import annotations

import uuid
from datetime import UTC, datetime, timedelta
from typing import Any
from zoneinfo import ZoneInfo

from tests.helpers.auth import ADMIN, auth, new_id
from tests.helpers.betting import ODDS
from tests.helpers.browser import Live, booked_slot, sign_in


async def test_a_doctor_found_from_the_overview_opens_on_the_doctors_today(
    page: Any, live: Live
) -> None:
    word = f"zq{uuid.uuid4().hex[:8]}"
    now = live.container.clock.now()
    tz = next(
        z
        for z in ("Pacific/Kiritimati", "Pacific/Pago_Pago")
        if now.astimezone(ZoneInfo(z)).date() != now.date()
    )
    r = await live.http.post(
        "/api/doctors", json={"name": f"Dr. Marie {word}", "timezone": tz}, headers=ADMIN
    )
    assert r.status_code == 201, r.text
    doctor = r.json()["id"]

    await sign_in(page, live)
    await page.select_option("#find-what", "doctor")
    await page.fill("#find-q", f"marie {word.upper()}")
    await page.click("form[action='/console/find'] button")
    await page.wait_for_load_state()
    assert page.url.startswith(f"{live.url}/console/clinic/doctors?q=")
    rows = page.locator("#found tbody tr")
    assert await rows.count() == 1
    await rows.first.locator("a").click()  # the second click
    await page.wait_for_load_state()
    assert page.url == f"{live.url}/console/clinic?doctor={doctor}"
    local_today = now.astimezone(ZoneInfo(tz)).date().isoformat()
    assert await page.input_value("#day") == local_today
    assert f"Dr. Marie {word}" in await page.locator("#agenda-h").inner_text()

    # On a phone's width the results fit the screen.
    await page.set_viewport_size({"width": 390, "height": 844})
    await page.goto(f"{live.url}/console/clinic/doctors?q={word}")
    assert await page.evaluate("document.documentElement.scrollWidth") <= 390


async def test_a_car_and_a_match_are_found_from_their_pages(page: Any, live: Live) -> None:
    word = f"zq{uuid.uuid4().hex[:8]}"
    car = await live.http.post(
        "/api/cars",
        json={
            "plate": f"B-{uuid.uuid4().hex[:10]}",
            "model": "Fiat Uno",
            "city": f"{word}ville",
            "dailyPrice": 10_000,
            "hostId": new_id(),
        },
        headers=ADMIN,
    )
    assert car.status_code == 201, car.text
    match = await live.http.post(
        "/api/matches",
        json={
            "externalId": f"ext-{word}",
            "home": "Porto",
            "away": "Braga",
            "startsAt": (datetime.now(UTC) + timedelta(hours=3)).isoformat(),
            "odds": ODDS,
        },
        headers=ADMIN,
    )
    assert match.status_code == 201, match.text

    await sign_in(page, live)
    await page.click("nav a[href='/console/rentals']")
    await page.fill("#find-car", f"{word}VILLE")
    await page.click("form[action='/console/rentals/cars'] button")
    await page.wait_for_load_state()
    await page.locator("#found tbody tr a").first.click()
    await page.wait_for_load_state()
    assert page.url == f"{live.url}/console/rentals?car={car.json()['id']}"
    assert f"{word}ville" in await page.locator("#cal-h").inner_text()

    await page.click("nav a[href='/console/betting']")
    await page.fill("#find-match", f"ext-{word}")
    await page.click("form[action='/console/betting/matches'] button")
    await page.wait_for_load_state()
    row = page.locator(f"#match-{match.json()['id']}")
    assert "Porto \N{EN DASH} Braga" in await row.inner_text()
    assert "none yet" in await row.inner_text()


async def test_a_patient_found_by_e_mail_leads_to_their_appointments(page: Any, live: Live) -> None:
    doctor, day, _, appointment = await booked_slot(live, doctor_name="Dr. Search")
    patient = (await live.http.get(f"/api/appointments/{appointment}", headers=ADMIN)).json()[
        "patientId"
    ]
    mail = f"Lena.{uuid.uuid4().hex[:8]}@example.org"
    r = await live.http.put(
        f"/api/patients/{patient}/contact", json={"email": mail}, headers=auth("patient", patient)
    )
    assert r.status_code == 200, r.text

    await sign_in(page, live)
    await page.click("nav a[href='/console/people']")
    await page.fill("#q", mail.lower())
    await page.click("form[action='/console/people'] button")
    await page.wait_for_load_state()
    row = page.locator(f"#person-{patient}")
    assert mail in await row.inner_text()
    await row.locator("a", has_text="Appointments").click()
    await page.wait_for_load_state()
    visit = page.locator(f"#appointment-{appointment}")
    assert "BOOKED" in await visit.inner_text()
    await visit.locator("a", has_text="Dr. Search").click()
    await page.wait_for_load_state()
    assert page.url == f"{live.url}/console/clinic?doctor={doctor}&day={day.isoformat()}"
