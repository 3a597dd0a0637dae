"""The console's clinic, rentals and betting pages over HTTP (no browser): each
needs a session, and bad input is refused with a 4xx page that changes nothing.
The browser journeys are in tests/browser/test_console_domain.py."""

from __future__ import annotations

from datetime import timedelta

import httpx

from reservo.betting.setup import Betting
from reservo.bootstrap import Container
from reservo.core_modules import Outbox
from tests.helpers.auth import ADMIN
from tests.helpers.betting import make_match
from tests.helpers.console import signed_in

PAGES = (
    "/console/clinic",
    "/console/clinic/slots/1/waitlist",
    "/console/clinic/appointments/1/cancel",
    "/console/rentals",
    "/console/rentals/bookings",
    "/console/betting",
)


async def test_the_pages_need_a_session(client: httpx.AsyncClient) -> None:
    for path in PAGES:
        r = await client.get(path)
        assert r.status_code == 303, path
        assert r.headers["location"] == f"/console/sign-in?next={path}"


async def test_unknown_things_are_said_on_the_page(client: httpx.AsyncClient) -> None:
    csrf = await signed_in(client)
    for path, status, words in (
        ("/console/clinic?doctor=987654321&day=2026-12-01", 404, "no doctor"),
        ("/console/clinic/slots/987654321/waitlist", 404, "no slot"),
        ("/console/clinic/appointments/987654321/cancel", 404, "no appointment"),
        ("/console/rentals?car=987654321", 404, "no car"),
        ("/console/rentals/bookings?customer=5&status=LOST", 422, "no booking status"),
    ):
        r = await client.get(path)
        assert r.status_code == status, (path, r.text)
        assert 'role="alert"' in r.text and words in r.text.lower(), path
    r = await client.post("/console/clinic/appointments/987654321/cancel", data={"csrf": csrf})
    assert r.status_code == 404 and "no appointment" in r.text.lower()


async def test_a_manual_result_is_refused_before_kick_off_and_without_scores(
    client: httpx.AsyncClient, container: Container
) -> None:
    csrf = await signed_in(client)
    match = await make_match(client, timedelta(hours=2))
    form = {"csrf": csrf, "match_id": str(match["id"]), "external_id": match["externalId"]}
    early = await client.post(
        "/console/betting/results",
        data={**form, "result_status": "FINISHED", "home_score": "1", "away_score": "0"},
    )
    assert early.status_code == 409 and 'role="alert"' in early.text
    no_scores = await client.post(
        "/console/betting/results", data={**form, "result_status": "FINISHED"}
    )
    assert no_scores.status_code == 422 and "homeScore" in no_scores.text
    while (
        await container.module(Betting).resender.run_once()
        or await container.module(Outbox).relay.run_once()
    ):
        pass
    got = (await client.get(f"/api/matches/{match['id']}", headers=ADMIN)).json()
    assert got["result"] is None and got["settlement"]["status"] == "OPEN"
