"""The console's clinic, rentals and betting pages in a real headless Chromium:
a slot's waitlist, a car's timeline, a match result posted by hand (twice, and
settled once), and forged posts on these actions refused with nothing changed."""

from __future__ import annotations

import uuid
from datetime import UTC, datetime, timedelta
from typing import Any

import orjson
from structlog.testing import capture_logs

from reservo.betting.setup import Betting
from reservo.core.http.auth import sign_webhook
from reservo.core_modules import Outbox
from tests.helpers.auth import ADMIN, PAY_SECRET, auth, new_id
from tests.helpers.betting import kick_off, make_account, make_match, place
from tests.helpers.browser import Live, booked_slot, sign_in
from tests.helpers.waiting import drain


async def test_the_agenda_shows_a_full_slot_and_its_waitlist(page: Any, live: Live) -> None:
    doctor_id, day, slot_id, _ = await booked_slot(live)
    waiting = [new_id(), new_id()]
    for patient in waiting:
        r = await live.http.post(
            f"/api/slots/{slot_id}/waitlist", json={"patientId": patient}, headers=ADMIN
        )
        assert r.status_code == 201, r.text

    await sign_in(page, live)
    await page.goto(f"{live.url}/console/clinic?doctor={doctor_id}&day={day.isoformat()}")
    seats = await page.locator(f"#slot-{slot_id} .seats").inner_text()
    assert "1/1 seats booked" in seats and "FULL" in seats  # words, not a colour
    await page.set_viewport_size({"width": 390, "height": 844})  # a phone
    await page.reload()
    assert await page.evaluate("document.documentElement.scrollWidth") <= 390
    await page.click(f"#slot-{slot_id} a[href$='/waitlist']")
    assert await page.evaluate("document.documentElement.scrollWidth") <= 390
    rows = page.locator("#waitlist tbody tr")
    assert await rows.count() == 2
    assert (await rows.nth(0).inner_text()).split()[:2] == ["1", str(waiting[0])]
    assert (await rows.nth(1).inner_text()).split()[:2] == ["2", str(waiting[1])]

    # An unknown doctor is said in words, with the page's status.
    r = await page.goto(f"{live.url}/console/clinic?doctor=999999999&day={day.isoformat()}")
    assert r is not None and r.status == 404
    assert await page.locator("[role=alert]").count() == 1


def at(hours: float) -> datetime:
    return (datetime.now(UTC) + timedelta(hours=hours)).replace(minute=0, second=0, microsecond=0)


async def test_the_car_timeline_shows_a_hold_and_a_confirmed_booking(page: Any, live: Live) -> None:
    http = live.http
    car = await http.post(
        "/api/cars",
        json={
            "plate": f"T-{uuid.uuid4().hex[:10]}",
            "model": "Fiat Uno",
            "city": "Porto",
            "dailyPrice": 10_000,
            "hostId": new_id(),
        },
        headers=ADMIN,
    )
    car_id = car.json()["id"]
    booked = []
    for start_h in (48, 120):
        customer = new_id()
        r = await http.post(
            "/api/bookings",
            json={
                "carId": car_id,
                "customerId": customer,
                "from": at(start_h).isoformat(),
                "to": at(start_h + 24).isoformat(),
            },
            headers={**auth("customer", customer), "Idempotency-Key": str(uuid.uuid4())},
        )
        assert r.status_code == 201, r.text
        booked.append(r.json())
    held, paid = booked
    raw = orjson.dumps(
        {
            "bookingId": paid["bookingId"],
            "providerTxnId": f"t-{uuid.uuid4()}",
            "amount": paid["depositAmount"],
            "status": "SUCCEEDED",
        }
    )
    sig = sign_webhook(PAY_SECRET, raw, int(live.container.clock.now().timestamp()))
    w = await http.post(
        "/api/payments/webhook",
        content=raw,
        headers={"X-Signature": sig, "Content-Type": "application/json"},
    )
    assert w.json() == {"result": "confirmed"}, w.text

    await sign_in(page, live)
    await page.click("nav a[href='/console/rentals']")
    await page.fill("#car", str(car_id))
    await page.fill("#day", at(24).date().isoformat())
    await page.fill("#days", "10")
    await page.click("form.picker button")
    timeline = await page.locator("svg.timeline").text_content() or ""
    assert f"HOLD #{held['bookingId']}" in timeline
    assert f"CONFIRMED #{paid['bookingId']}" in timeline
    assert "buffer" in timeline
    table = await page.locator("#periods").inner_text()
    assert f"{held['bookingId']}\tHOLD" in table and f"{paid['bookingId']}\tCONFIRMED" in table

    # The paid customer's bookings, filtered by status.
    await page.click("a[href='/console/rentals/bookings']")
    await page.fill("#customer", str(paid["customerId"]))
    await page.select_option("#status", "CONFIRMED")
    await page.click("form.picker button")
    assert (
        f"{paid['bookingId']}\t{car_id}\tCONFIRMED" in await page.locator("#bookings").inner_text()
    )
    await page.select_option("#status", "HOLD")
    await page.click("form.picker button")
    assert "No booking." in await page.locator("#bookings").inner_text()

    # On a phone, the timeline and the lists fit the screen's width.
    await page.set_viewport_size({"width": 390, "height": 844})
    for path in (f"/console/rentals?car={car_id}&days=10", "/console/betting", page.url):
        await page.goto(f"{live.url}{path}" if path.startswith("/") else path)
        assert await page.evaluate("document.documentElement.scrollWidth") <= 390, path


async def find_match(page: Any, live: Live, match_id: int) -> Any:
    """The match's card on the STARTED list, following its pages."""
    await page.goto(f"{live.url}/console/betting?status=STARTED")
    for _ in range(100):
        card = page.locator(f"#match-{match_id}")
        if await card.count():
            return card
        await page.click("a[rel=next]")
    raise AssertionError(f"match {match_id} not listed")


async def test_a_result_posted_twice_by_hand_settles_once(page: Any, live: Live) -> None:
    http = live.http
    match = await make_match(http, timedelta(minutes=1))
    winner, w_owner = await make_account(http, 1_000)
    loser, l_owner = await make_account(http, 1_000)
    bets = [
        await place(http, winner, w_owner, 100, [(match["id"], "1X2", "HOME")]),
        await place(http, loser, l_owner, 100, [(match["id"], "1X2", "AWAY")]),
    ]
    assert [b.status_code for b in bets] == [201, 201]
    kick_off(live.container.clock, match)

    await sign_in(page, live)
    card = await find_match(page, live, match["id"])
    assert "none yet" in await card.locator(".result").inner_text()
    await card.locator("summary").click()
    await card.locator("select[name=result_status]").select_option("FINISHED")
    await card.locator("input[name=home_score]").fill("2")
    await card.locator("input[name=away_score]").fill("1")
    form = {
        name: await card.locator(f"input[name={name}]").input_value()
        for name in ("csrf", "match_id", "external_id", "home_score", "away_score")
    }
    with capture_logs() as logs:
        await card.locator("button[type=submit]").click()
        await page.wait_for_url(f"**/console/betting?status=STARTED&posted={match['id']}")
        # The same post again, as a double click or a resent form would send it.
        again = await page.request.post(
            f"{live.url}/console/betting/results",
            form={**form, "result_status": "FINISHED"},
            max_redirects=0,
        )
    assert again.status == 303
    posted = [e for e in logs if e["event"] == "match_result_posted_by_hand"]
    assert [(e["admin"], e["match_external_id"]) for e in posted] == [(1, match["externalId"])] * 2
    await drain(live.container.module(Betting).resender, live.container.module(Outbox).relay)

    got = await http.get(f"/api/matches/{match['id']}", headers=ADMIN)
    body = got.json()
    assert body["result"]["homeScore"] == 2 and body["result"]["awayScore"] == 1
    assert body["result"]["providerEventId"] == f"console:{match['externalId']}:FINISHED:2-1"
    assert body["settlement"] == {"status": "SETTLED", "pendingBets": 0, "settledBets": 2}
    balances = [
        (await http.get(f"/api/accounts/{a}", headers=ADMIN)).json()["balance"]
        for a in (winner, loser)
    ]
    assert balances == [900 + 180, 900]  # paid once
    async with live.container.db.connection() as conn:
        payouts = await conn.fetchval(
            "SELECT count(*) FROM wallet_transfer WHERE kind = 'PAYOUT' AND reference = $1",
            f"bet:{bets[0].json()['id']}",
        )
    assert payouts == 1

    await page.goto(f"{live.url}/console/betting?status=SETTLED")
    settled = page.locator(f"#match-{match['id']}")
    if await settled.count():  # on the first page when the database is young
        assert "SETTLED" in await settled.locator(".settlement").inner_text()


async def test_forged_posts_on_the_domain_actions_are_refused_and_change_nothing(
    page: Any, live: Live
) -> None:
    _, _, _, appointment_id = await booked_slot(live)
    match = await make_match(live.http, timedelta(minutes=1))
    kick_off(live.container.clock, match)
    await sign_in(page, live)
    result = {
        "match_id": str(match["id"]),
        "external_id": match["externalId"],
        "result_status": "CANCELLED",
    }
    actions = [
        (f"/console/clinic/appointments/{appointment_id}/cancel", {}),
        ("/console/betting/results", result),
    ]
    csrf = await page.locator("form.sign-out input[name=csrf]").get_attribute("value")
    for path, fields in actions:
        for forged, headers in (
            ({"csrf": "forged"}, {}),
            ({}, {}),
            ({"csrf": csrf}, {"Origin": "https://evil.example"}),
        ):
            r = await page.request.post(
                f"{live.url}{path}", form={**fields, **forged}, headers=headers, max_redirects=0
            )
            assert r.status == 403, (path, forged, headers, await r.text())
        # Without a session at all: sent to sign in.
        r2 = await live.http.post(path, data={**fields, "csrf": csrf})
        assert r2.status_code == 303 and "/console/sign-in" in r2.headers["location"]
    await drain(live.container.module(Betting).resender, live.container.module(Outbox).relay)

    got = await live.http.get(f"/api/appointments/{appointment_id}", headers=ADMIN)
    assert got.json()["status"] == "BOOKED"
    m = (await live.http.get(f"/api/matches/{match['id']}", headers=ADMIN)).json()
    assert m["result"] is None and m["settlement"]["status"] == "OPEN"
