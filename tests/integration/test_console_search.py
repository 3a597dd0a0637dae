"""Issue 24 part 5 over HTTP: the console finds doctors by name, cars by model or
city, matches by team or external id, and patients and customers by id or
e-mail, each a keyset list; the operator's text is matched as typed (its
wildcards are plain characters), escaped on the page, and bad text or cursors
are refused with a 4xx page; every console page is at most two clicks from the
overview. The browser journeys are in tests/browser/test_console_search.py."""

from __future__ import annotations

import re
import uuid
from datetime import UTC, datetime, timedelta
from html import unescape
from urllib.parse import urlsplit
from zoneinfo import ZoneInfo

import asyncpg
import httpx
from fastapi import FastAPI
from fastapi.routing import APIRoute

from reservo.bootstrap import Container
from reservo.console.search import FIND
from reservo.core.http.pagination import encode_cursor
from tests.helpers.appointments import book, make_slots
from tests.helpers.auth import ADMIN, auth, new_id
from tests.helpers.betting import ODDS, make_account
from tests.helpers.console import signed_in

SEARCHES = ("/console/clinic/doctors", "/console/rentals/cars", "/console/betting/matches")
PAGES = (*SEARCHES, "/console/people", "/console/clinic/appointments?patient=1", "/console/find")


def token() -> str:
    """A word no other row's name holds (tests share the database)."""
    return f"zq{uuid.uuid4().hex[:10]}"


async def make_doctor(client: httpx.AsyncClient, name: str, tz: str = "Europe/Lisbon") -> int:
    r = await client.post("/api/doctors", json={"name": name, "timezone": tz}, headers=ADMIN)
    assert r.status_code == 201, r.text
    return int(r.json()["id"])


async def make_car(client: httpx.AsyncClient, model: str, city: str) -> int:
    body = {
        "plate": f"S-{uuid.uuid4().hex[:10]}",
        "model": model,
        "city": city,
        "dailyPrice": 10_000,
        "hostId": new_id(),
    }
    r = await client.post("/api/cars", json=body, headers=ADMIN)
    assert r.status_code == 201, r.text
    return int(r.json()["id"])


async def make_match(client: httpx.AsyncClient, home: str, away: str, external_id: str) -> int:
    body = {
        "externalId": external_id,
        "home": home,
        "away": away,
        "startsAt": (datetime.now(UTC) + timedelta(hours=2)).isoformat(),
        "odds": ODDS,
    }
    r = await client.post("/api/matches", json=body, headers=ADMIN)
    assert r.status_code == 201, r.text
    return int(r.json()["id"])


def found(html: str) -> list[list[str]]:
    """The rows of the page's result table, each a list of its cells' text."""
    body = re.search(r'<table id="found">(.*?)</table>', html, re.S)
    assert body is not None, html
    rows = re.findall(r"<tr[^>]*>(.*?)</tr>", body[1], re.S)[1:]  # without the header
    return [
        [
            " ".join(unescape(re.sub(r"<[^>]+>", " ", c)).split())
            for c in re.findall(r"<td[^>]*>(.*?)</td>", r, re.S)
        ]
        for r in rows
    ]


def next_link(html: str) -> str | None:
    link = re.search(r'<a rel="next" href="([^"]+)"', html)
    return unescape(link[1]) if link else None


async def test_the_search_pages_need_a_session(client: httpx.AsyncClient) -> None:
    for path in PAGES:
        r = await client.get(path)
        assert r.status_code == 303, path
        assert r.headers["location"].startswith("/console/sign-in?next="), path


async def test_a_doctor_is_found_by_part_of_the_name_and_opens_on_the_doctors_today(
    client: httpx.AsyncClient, container: Container
) -> None:
    await signed_in(client)
    word = token()
    # A zone whose date differs from UTC's right now: the day picker must show
    # the doctor's today, not the server's.
    now = container.clock.now()
    tz = next(
        z
        for z in ("Pacific/Kiritimati", "Pacific/Pago_Pago")
        if now.astimezone(ZoneInfo(z)).date() != now.date()
    )
    doctor = await make_doctor(client, f"Dr. Ana {word.upper()} Lima", tz)

    r = await client.get("/console/clinic/doctors", params={"q": f"ana {word}"})
    assert r.status_code == 200, r.text
    assert found(r.text) == [[str(doctor), f"Dr. Ana {word.upper()} Lima", "", tz]]
    link = re.search(rf'href="(/console/clinic\?doctor={doctor})"', r.text)
    assert link is not None

    agenda = await client.get(link[1])
    assert agenda.status_code == 200, agenda.text
    local_today = now.astimezone(ZoneInfo(tz)).date().isoformat()
    assert f'name="day" type="date" required value="{local_today}"' in agenda.text
    assert f"Dr. Ana {word.upper()} Lima (doctor {doctor}, {tz})" in agenda.text

    nobody = await client.get("/console/clinic/doctors", params={"q": f"{word}-nobody"})
    assert nobody.status_code == 200
    assert found(nobody.text) == [["No doctor's name contains that."]]


async def test_a_search_is_a_keyset_list(client: httpx.AsyncClient) -> None:
    await signed_in(client)
    word = token()
    names = [f"Dr. {word} {i:02d}" for i in range(27)]
    for name in reversed(names):  # created out of name order
        await make_doctor(client, name)
    first = await client.get("/console/clinic/doctors", params={"q": word})
    assert first.status_code == 200
    page_one = found(first.text)
    assert len(page_one) == 25
    nxt = next_link(first.text)
    assert nxt is not None and nxt.startswith("/console/clinic/doctors?q=")
    # A doctor created meanwhile before the cursor does not shift the next page.
    await make_doctor(client, f"Dr. {word} 00a")
    second = await client.get(nxt)
    page_two = found(second.text)
    assert next_link(second.text) is None
    assert [row[1] for row in page_one + page_two] == names  # in name order, each once


async def test_the_text_is_matched_as_typed(client: httpx.AsyncClient) -> None:
    """% and _ are characters of the name, never wildcards; any case matches."""
    await signed_in(client)
    word = token()
    percent = await make_doctor(client, f"Dr. 100% {word}")
    await make_doctor(client, f"Dr. 1000 {word}")
    under = await make_doctor(client, f"Dr. A_{word}")
    await make_doctor(client, f"Dr. AB{word}")
    for text, only in (("0% " + word, percent), ("_" + word.upper(), under)):
        r = await client.get("/console/clinic/doctors", params={"q": text})
        rows = found(r.text)
        assert [row[0] for row in rows] == [str(only)], (text, rows)


async def test_names_are_escaped_on_the_page(client: httpx.AsyncClient) -> None:
    await signed_in(client)
    word = token()
    await make_doctor(client, f'<script>alert("{word}")</script>')
    r = await client.get("/console/clinic/doctors", params={"q": word})
    assert r.status_code == 200
    assert "<script>alert" not in r.text
    assert "&lt;script&gt;alert(&#34;" + word in r.text
    # The text typed comes back in the form, escaped too.
    typed = await client.get("/console/clinic/doctors", params={"q": f'"><b>{word}'})
    assert f"<b>{word}" not in typed.text and f"&lt;b&gt;{word}" in typed.text


async def test_bad_text_and_cursors_are_refused_with_a_4xx_page(
    client: httpx.AsyncClient,
) -> None:
    await signed_in(client)
    name_cursor_of_other_list = encode_cursor(1_000_000, 5)  # a time cursor
    for path, params, words in (
        ("/console/clinic/doctors", {"q": "a\x00b"}, "control character"),
        ("/console/people", {"q": "ana\x07"}, "control character"),
        ("/console/rentals/cars", {"q": "x", "after": "not-a-cursor"}, "malformed cursor"),
        ("/console/clinic/doctors", {"q": "x", "after": name_cursor_of_other_list}, "malformed"),
        ("/console/clinic/doctors", {"q": "x", "after": encode_cursor("a\x00", 5)}, "malformed"),
        ("/console/betting/matches", {"q": "x", "after": encode_cursor("a", 5)}, "malformed"),
        ("/console/people", {"q": "99999999999999999999"}, "no user id"),
        ("/console/people", {"q": "ana", "after": encode_cursor("a")}, "malformed"),
        ("/console/clinic/appointments", {"patient": "1", "after": "x"}, "malformed"),
    ):
        r = await client.get(path, params=params)
        assert r.status_code == 422, (path, params, r.text)
        assert 'role="alert"' in r.text and words in r.text, (path, params)
    for path, params in (
        ("/console/clinic/doctors", {"q": "x" * 101}),
        ("/console/find", {"what": "spaceship", "q": "x"}),
        ("/console/clinic/appointments", {"patient": "0"}),
    ):
        r = await client.get(path, params=params)
        assert r.status_code == 422, (path, params)
        assert r.headers["content-type"] == "application/problem+json"
        assert r.json()["code"] == "validation_error"


async def test_the_overview_find_form_leads_to_each_search(client: httpx.AsyncClient) -> None:
    await signed_in(client)
    overview = await client.get("/console")
    assert 'action="/console/find"' in overview.text
    for what, path in FIND.items():
        r = await client.get("/console/find", params={"what": what, "q": "a b&c"})
        assert r.status_code == 303
        assert r.headers["location"] == f"{path}?q=a+b%26c"


async def test_a_car_is_found_by_model_or_city(client: httpx.AsyncClient) -> None:
    await signed_in(client)
    word = token()
    by_model = await make_car(client, f"Fiat {word}", "Porto")
    by_city = await make_car(client, "Opel Corsa", f"{word}ville")
    await make_car(client, "Fiat Uno", "Braga")
    r = await client.get("/console/rentals/cars", params={"q": word.upper()})
    assert r.status_code == 200
    rows = found(r.text)
    assert [row[0] for row in rows] == [str(by_model), str(by_city)]  # model order
    assert f'href="/console/rentals?car={by_city}"' in r.text
    calendar = await client.get(f"/console/rentals?car={by_city}")
    assert calendar.status_code == 200 and f"{word}ville" in calendar.text


async def test_a_match_is_found_by_team_or_external_id(client: httpx.AsyncClient) -> None:
    await signed_in(client)
    word = token()
    home = await make_match(client, f"FC {word}", "Braga", f"ext-{uuid.uuid4()}")
    away = await make_match(client, "Benfica", f"{word} United", f"ext-{uuid.uuid4()}")
    external = await make_match(client, "Porto", "Boavista", f"ext-{word}-1")
    r = await client.get("/console/betting/matches", params={"q": word})
    assert r.status_code == 200
    assert {row[0] for row in found(r.text)} == {str(home), str(away), str(external)}
    assert "none yet" in r.text and "OPEN" in r.text


async def test_a_person_is_found_by_id_or_e_mail(client: httpx.AsyncClient) -> None:
    await signed_in(client)
    word = token()
    # A patient with a contact and an appointment.
    patient = new_id()
    r = await client.put(
        f"/api/patients/{patient}/contact",
        json={"email": f"Ana.{word}@example.org"},
        headers=auth("patient", patient),
    )
    assert r.status_code == 200, r.text
    doctor, slots = await make_slots(client, tz="Asia/Tokyo")
    booked = await book(client, slots[0]["id"], patient)
    assert booked.status_code == 201, booked.text
    # A customer with a wallet account and no contact: found by id only.
    account, owner = await make_account(client, 0)

    by_mail = await client.get("/console/people", params={"q": f"ana.{word.upper()}@"})
    assert found(by_mail.text) == [
        [str(patient), f"Ana.{word}@example.org", "", "Appointments", "none", "none"]
    ]
    by_id = await client.get("/console/people", params={"q": str(owner)})
    assert found(by_id.text) == [[str(owner), "", "", "none", "none", f"EUR 0 (account {account})"]]
    unknown = await client.get("/console/people", params={"q": str(new_id())})
    assert found(unknown.text) == [["Nobody found."]]

    # The patient's appointments, each opening the doctor's day at its local date.
    link = f"/console/clinic/appointments?patient={patient}"
    assert f'href="{link}"' in by_mail.text
    visits = await client.get(link)
    assert visits.status_code == 200, visits.text
    start = datetime.fromisoformat(slots[0]["startAt"])
    local = start.astimezone(ZoneInfo("Asia/Tokyo")).date().isoformat()
    assert f"/console/clinic?doctor={doctor}&amp;day={local}" in visits.text
    assert "BOOKED" in visits.text and "/cancel?day=" in visits.text


async def test_a_persons_bookings_are_linked(client: httpx.AsyncClient) -> None:
    await signed_in(client)
    car = await make_car(client, "Fiat Uno", "Porto")
    customer = new_id()
    start = (datetime.now(UTC) + timedelta(days=3)).replace(minute=0, second=0, microsecond=0)
    r = await client.post(
        "/api/bookings",
        json={
            "carId": car,
            "customerId": customer,
            "from": start.isoformat(),
            "to": (start + timedelta(days=1)).isoformat(),
        },
        headers={**auth("customer", customer), "Idempotency-Key": str(uuid.uuid4())},
    )
    assert r.status_code == 201, r.text
    person = await client.get("/console/people", params={"q": str(customer)})
    assert f'href="/console/rentals/bookings?customer={customer}"' in person.text


# -- indexes ------------------------------------------------------------------------

TRIGRAM = {
    "doctor_name_trgm": "doctor",
    "car_model_trgm": "car",
    "car_city_trgm": "car",
    "betting_match_home_trgm": "betting_match",
    "betting_match_away_trgm": "betting_match",
    "betting_match_external_id_trgm": "betting_match",
    "contact_email_trgm": "contact",
}


async def test_migration_0043_indexes_each_searched_column(db: asyncpg.Connection) -> None:
    """A trigram GIN index per searched column (ILIKE '%text%' reads it; measured
    in docs/_w2/consolesearch.md), and the owner index of wallet accounts."""
    rows = await db.fetch(
        "SELECT indexname, tablename, indexdef FROM pg_indexes WHERE indexname = ANY($1)",
        [*TRIGRAM, "wallet_account_owner"],
    )
    defs = {r["indexname"]: (r["tablename"], r["indexdef"]) for r in rows}
    for index, table in TRIGRAM.items():
        assert defs[index][0] == table and "USING gin" in defs[index][1], index
        assert "gin_trgm_ops" in defs[index][1], index
    assert "WHERE (kind = 'CUSTOMER'" in defs["wallet_account_owner"][1]


# -- navigation ----------------------------------------------------------------------

# Not pages: assets, the fragments htmx refreshes, and the sign-in form.
NOT_PAGES = {
    "/console/static/{name}",
    "/console/overview/panels",
    "/console/jobs/counts",
    "/console/sign-in",
}


def _console_pages(app: FastAPI) -> dict[str, re.Pattern[str]]:
    """Every console page (GET) by its route's path, with a pattern of its URLs."""
    pages = {}
    for route in app.routes:
        if not isinstance(route, APIRoute) or "GET" not in route.methods:
            continue
        if route.path.startswith("/console") and route.path not in NOT_PAGES:
            pages[route.path] = re.compile(re.sub(r"\{[^}]+\}", "[^/]+", route.path) + "$")
    return pages


def _clicks(html: str) -> set[str]:
    """Where one click on the page goes: each link, and each GET form submitted
    (its first option, and any text field given a word)."""
    targets = {unescape(h) for h in re.findall(r'<a [^>]*href="([^"]+)"', html)}
    for form in re.finditer(r"<form ([^>]*)>(.*?)</form>", html, re.S):
        attrs, body = form[1], form[2]
        if 'method="post"' in attrs:
            continue
        action = re.search(r'action="([^"]+)"', attrs)
        if action is not None:
            params = []
            for name in re.findall(r'<(?:input|select)[^>]*name="([^"]+)"', body):
                params.append(f"{name}=1" if name in ("doctor", "car", "customer") else f"{name}=a")
            targets.add(f"{action[1]}?{'&'.join(params)}")
    return {t for t in targets if t.startswith("/console")}


async def test_every_page_is_at_most_two_clicks_from_the_overview(
    client: httpx.AsyncClient,
) -> None:
    await signed_in(client)
    # Something to find on every page: an appointment (the overview's latest),
    # a job, a patient.
    _, slots = await make_slots(client)
    assert (await book(client, slots[0]["id"], new_id())).status_code == 201
    job = await client.post(
        "/api/jobs",
        json={
            "category": "http",
            "runAt": (datetime.now(UTC) + timedelta(days=1)).isoformat(),
            "payload": {"url": "http://x.test/"},
        },
        headers={**ADMIN, "Idempotency-Key": str(uuid.uuid4())},
    )
    assert job.status_code == 201, job.text
    transport = client._transport
    assert isinstance(transport, httpx.ASGITransport) and isinstance(transport.app, FastAPI)
    pages = _console_pages(transport.app)

    reached: dict[str, int] = {}
    frontier, seen = ["/console"], {"/console"}
    for clicks in range(3):
        following = []
        for url in frontier:
            r = await client.get(url, follow_redirects=True)
            path = urlsplit(str(r.url)).path
            for route, pattern in pages.items():
                if pattern.match(path):
                    reached.setdefault(route, clicks)
            if clicks < 2:
                following += [t for t in _clicks(r.text) if t not in seen]
                seen.update(following)
        frontier = following
    missing = {p for p in pages if p not in reached and "{" not in p}
    assert missing == set(), missing
    # Pages of one thing (a slot's waitlist, a job, ...) are reached too when
    # there is one to show: the dead-letter page needs a parked event.
    one_thing = {p for p in pages if "{" in p and "dead-letters" not in p}
    assert one_thing - reached.keys() == set()
