"""Calendar feeds (issue 27) through HTTP: a patient's and a doctor's feed behind
secret, revocable URLs, parsed with the `icalendar` package (PyPI) as a calendar
application would; stable UIDs with SEQUENCE bumped on reschedule; cancelled
events; the owner rules; conditional requests; and the cache bound: concurrent
polls of a feed read PostgreSQL once, until a change drops the feed."""

from __future__ import annotations

import asyncio
import hashlib
from collections.abc import AsyncIterator
from datetime import UTC, datetime, timedelta
from typing import Any
from urllib.parse import urlsplit

import asyncpg
import httpx
import icalendar
import pytest

from reservo.app import create_app
from reservo.appointments.calendar import feed_key
from reservo.bootstrap import Container, build
from reservo.core.kernel.clock import OffsetClock
from reservo.settings import Settings
from tests.helpers.appointments import book, make_doctor, make_slots, reschedule
from tests.helpers.auth import ADMIN, auth, auth_at, new_id
from tests.helpers.statements import Statements

ICS = "text/calendar; charset=utf-8"


async def link(client: httpx.AsyncClient, owner: str, owner_id: int, headers: Any) -> str:
    r = await client.post(f"/api/{owner}s/{owner_id}/calendar-link", headers=headers)
    assert r.status_code == 201, r.text
    url: str = r.json()["url"]
    assert set(r.json()) == {"url"}
    return urlsplit(url).path  # the test's client reaches the app itself


async def patient_link(client: httpx.AsyncClient, patient: int) -> str:
    return await link(client, "patient", patient, auth("patient", patient))


async def events(client: httpx.AsyncClient, path: str) -> list[icalendar.Event]:
    r = await client.get(path)
    assert r.status_code == 200, r.text
    assert r.headers["content-type"] == ICS
    cal = icalendar.Calendar.from_ical(r.content)
    assert str(cal["VERSION"]) == "2.0" and cal["PRODID"]
    return list(cal.walk("VEVENT"))


def by_uid(evs: list[icalendar.Event]) -> dict[str, icalendar.Event]:
    out = {str(e["UID"]): e for e in evs}
    assert len(out) == len(evs), "a UID twice in one feed"
    return out


def start(e: icalendar.Event) -> datetime:
    dt: datetime = e.decoded("DTSTART")
    return dt


def at(slot: dict[str, Any]) -> datetime:
    return datetime.fromisoformat(slot["startAt"])


# -- the feed as a calendar application reads it --------------------------------------


async def test_a_patient_feed_is_rfc5545_with_one_event_per_booked_appointment(
    client: httpx.AsyncClient,
) -> None:
    _, slots = await make_slots(client, capacity=2)
    patient, other = new_id(), new_id()
    mine = [(await book(client, s["id"], patient)).json() for s in slots[:2]]
    assert (await book(client, slots[2]["id"], other)).status_code == 201
    path = await patient_link(client, patient)
    assert path.startswith("/calendars/") and path.endswith(".ics")

    r = await client.get(path)
    raw = r.content
    # CRLF line ends only, no physical line over 75 octets.
    assert raw.endswith(b"\r\n") and b"\n" not in raw.replace(b"\r\n", b"")
    assert all(len(line) <= 75 for line in raw.split(b"\r\n"))
    evs = by_uid(await events(client, path))
    assert set(evs) == {f"appointment-{a['id']}@reservo" for a in mine}
    for a in mine:
        e = evs[f"appointment-{a['id']}@reservo"]
        assert start(e) == datetime.fromisoformat(a["startAt"])
        assert e.decoded("DTEND") == datetime.fromisoformat(a["endAt"])
        # In UTC (the ...Z form), no TZID a client would have to resolve.
        assert start(e).utcoffset() == timedelta(0) and "TZID" not in e["DTSTART"].params
        assert e["DTSTART"].to_ical().endswith(b"Z")
        assert (str(e["STATUS"]), int(e["SEQUENCE"])) == ("CONFIRMED", 0)
        assert e.decoded("DTSTAMP") <= datetime.now(UTC)
        # The doctor's name, and nothing of the patient's.
        assert str(e["SUMMARY"]) == "Appointment with Dr. Test"
        assert str(patient) not in e.to_ical().decode()


async def test_names_are_escaped_and_long_lines_folded(client: httpx.AsyncClient) -> None:
    name = 'Dr. Smith, Jr.; "Zoë" \\ Ünïcødé-' + "é" * 60 + "\nsecond line"
    r = await client.post(
        "/api/doctors", json={"name": name, "timezone": "Europe/Lisbon"}, headers=ADMIN
    )
    doctor = r.json()["id"]
    day = (datetime.now(UTC) + timedelta(days=2)).date().isoformat()
    schedule = {
        "from": day,
        "to": day,
        "weekdays": list(range(1, 8)),
        "startTime": "08:00",
        "endTime": "09:00",
        "slotMinutes": 30,
        "capacity": 1,
    }
    assert (
        await client.post(f"/api/doctors/{doctor}/schedules", json=schedule, headers=ADMIN)
    ).status_code == 201
    slots = (
        await client.get(f"/api/doctors/{doctor}/slots", params={"date": day}, headers=ADMIN)
    ).json()
    patient = new_id()
    assert (await book(client, slots[0]["id"], patient)).status_code == 201
    path = await patient_link(client, patient)
    raw = (await client.get(path)).content
    assert all(len(line) <= 75 for line in raw.split(b"\r\n"))
    raw.decode("utf-8")  # folding never split a character
    (e,) = await events(client, path)
    assert str(e["SUMMARY"]) == f"Appointment with {name}"


# -- stable UIDs: a reschedule updates the same event ------------------------------------


async def test_a_reschedule_updates_the_same_uid_with_a_higher_sequence(
    client: httpx.AsyncClient,
) -> None:
    doctor, slots = await make_slots(client, capacity=1)
    patient = new_id()
    me = auth("patient", patient)
    first = (await book(client, slots[0]["id"], patient)).json()
    uid = f"appointment-{first['id']}@reservo"
    path = await patient_link(client, patient)
    agenda = await link(client, "doctor", doctor, ADMIN)
    for feed in (path, agenda):
        (e,) = await events(client, feed)
        assert (str(e["UID"]), int(e["SEQUENCE"])) == (uid, 0)

    moved = (await reschedule(client, first["id"], slots[2]["id"], me)).json()
    again = (await reschedule(client, moved["id"], slots[3]["id"], me)).json()
    for feed in (path, agenda):
        # One event, the same UID, the latest slot: the rescheduled-away
        # appointments are not left behind as cancelled duplicates.
        (e,) = await events(client, feed)
        assert (str(e["UID"]), int(e["SEQUENCE"])) == (uid, 2)
        assert start(e) == at(slots[3]) and str(e["STATUS"]) == "CONFIRMED"

    # Cancelled: still the same UID, a higher SEQUENCE, STATUS:CANCELLED.
    r = await client.delete(f"/api/appointments/{again['id']}", headers=me)
    assert r.status_code == 200
    for feed in (path, agenda):
        (e,) = await events(client, feed)
        assert (str(e["UID"]), int(e["SEQUENCE"])) == (uid, 3)
        assert str(e["STATUS"]) == "CANCELLED" and start(e) == at(slots[3])


async def test_a_move_to_another_doctor_leaves_a_cancelled_event_in_the_first_agenda(
    client: httpx.AsyncClient,
) -> None:
    doctor, slots = await make_slots(client, capacity=1)
    other_doctor, others = await make_slots(client, capacity=1)
    patient = new_id()
    first = (await book(client, slots[0]["id"], patient)).json()
    uid = f"appointment-{first['id']}@reservo"
    agenda = await link(client, "doctor", doctor, auth("doctor", doctor))
    other_agenda = await link(client, "doctor", other_doctor, auth("doctor", other_doctor))
    assert await events(client, other_agenda) == []
    await reschedule(client, first["id"], others[2]["id"], auth("patient", patient))

    (gone,) = await events(client, agenda)
    assert (str(gone["UID"]), str(gone["STATUS"]), int(gone["SEQUENCE"])) == (uid, "CANCELLED", 1)
    (there,) = await events(client, other_agenda)
    assert (str(there["UID"]), str(there["STATUS"]), int(there["SEQUENCE"])) == (
        uid,
        "CONFIRMED",
        1,
    )
    # A doctor's feed names the patient by id only.
    assert str(there["SUMMARY"]) == f"Appointment: patient #{patient}"


async def test_cancelled_events_stay_30_days_and_past_ones_from_30_days_ago(
    client: httpx.AsyncClient, clock: OffsetClock
) -> None:
    _, slots = await make_slots(client, capacity=1)
    patient = new_id()
    me = auth("patient", patient)
    kept = (await book(client, slots[0]["id"], patient)).json()
    dropped = (await book(client, slots[2]["id"], patient)).json()
    assert (await client.delete(f"/api/appointments/{dropped['id']}", headers=me)).status_code
    path = await patient_link(client, patient)
    evs = by_uid(await events(client, path))
    assert str(evs[f"appointment-{dropped['id']}@reservo"]["STATUS"]) == "CANCELLED"
    assert int(evs[f"appointment-{dropped['id']}@reservo"]["SEQUENCE"]) == 1

    # 31 days later: the cancellation is over 30 days old, the past appointment
    # started 29 days ago and is still shown. (A new link drops the cached feed.)
    clock.advance(timedelta(days=31))
    path = await link(client, "patient", patient, auth_at(clock, "patient", patient))
    assert set(by_uid(await events(client, path))) == {f"appointment-{kept['id']}@reservo"}
    clock.advance(timedelta(days=3))
    path = await link(client, "patient", patient, auth_at(clock, "patient", patient))
    assert await events(client, path) == []


async def test_a_seat_given_from_the_waitlist_shows_in_that_patients_feed_at_once(
    client: httpx.AsyncClient,
) -> None:
    _, slots = await make_slots(client, capacity=1)
    first, waiting = new_id(), new_id()
    taken = (await book(client, slots[0]["id"], first)).json()
    r = await client.post(
        f"/api/slots/{slots[0]['id']}/waitlist",
        json={"patientId": waiting},
        headers=auth("patient", waiting),
    )
    assert r.status_code == 201, r.text
    path = await patient_link(client, waiting)
    assert await events(client, path) == []  # cached now
    r = await client.delete(f"/api/appointments/{taken['id']}", headers=auth("patient", first))
    assert r.status_code == 200
    (e,) = await events(client, path)
    assert start(e) == at(slots[0]) and str(e["STATUS"]) == "CONFIRMED"


# -- links: owners, revocation ------------------------------------------------------------


async def test_only_the_owner_or_an_admin_makes_a_link(client: httpx.AsyncClient) -> None:
    doctor = await make_doctor(client)
    patient, other = new_id(), new_id()
    cases = [
        (f"/api/patients/{patient}/calendar-link", auth("patient", other), 403, "forbidden"),
        (f"/api/patients/{patient}/calendar-link", auth("doctor", patient), 403, "forbidden"),
        (f"/api/doctors/{doctor}/calendar-link", auth("doctor", doctor + 1), 403, "forbidden"),
        (f"/api/doctors/{doctor}/calendar-link", auth("patient", doctor), 403, "forbidden"),
        (f"/api/doctors/{2**62}/calendar-link", ADMIN, 404, "doctor_not_found"),
        (f"/api/patients/{patient}/calendar-link", {}, 401, "unauthenticated"),
        ("/api/patients/0/calendar-link", ADMIN, 422, "validation_error"),
    ]
    for url, headers, status, code in cases:
        r = await client.post(url, headers=headers)
        assert (r.status_code, r.json()["code"]) == (status, code), (url, r.text)
        assert r.headers["content-type"] == "application/problem+json"
    # The owner and an admin.
    assert (await patient_link(client, patient)).endswith(".ics")
    assert (await link(client, "patient", patient, ADMIN)).endswith(".ics")
    assert (await link(client, "doctor", doctor, auth("doctor", doctor))).endswith(".ics")


async def test_a_new_link_revokes_the_previous_one_at_once(
    client: httpx.AsyncClient, db: asyncpg.Connection
) -> None:
    _, slots = await make_slots(client, capacity=1)
    patient = new_id()
    assert (await book(client, slots[0]["id"], patient)).status_code == 201
    old = await patient_link(client, patient)
    assert len(await events(client, old)) == 1  # cached now, here and in Redis
    new = await patient_link(client, patient)
    assert new != old
    for path in (old, old + "?x=1"):
        r = await client.get(path)
        assert (r.status_code, r.json()["code"]) == (404, "calendar_not_found")
        assert r.headers["content-type"] == "application/problem+json"
    assert len(await events(client, new)) == 1
    # Only the secret's SHA-256 is stored: the database holds no working URL.
    secret = new.removeprefix("/calendars/").removesuffix(".ics")
    stored = await db.fetchval(
        "SELECT token_sha256 FROM calendar_link WHERE owner_kind = 'patient' AND owner_id = $1",
        patient,
    )
    assert bytes(stored) == hashlib.sha256(secret.encode()).digest()
    assert len(secret) >= 22  # >= 128 bits of base64url


@pytest.mark.parametrize(
    "path",
    [
        "/calendars/" + "A" * 43 + ".ics",  # well-formed, unknown
        "/calendars/short.ics",
        "/calendars/" + "A" * 44 + ".ics",
        "/calendars/" + "%00" * 43 + ".ics",
        "/calendars/.ics",
    ],
)
async def test_an_unknown_or_malformed_url_is_404(client: httpx.AsyncClient, path: str) -> None:
    r = await client.get(path)
    assert r.status_code == 404
    if r.headers["content-type"] == "application/problem+json":
        assert r.json()["code"] in {"calendar_not_found", "not_found"}


# -- conditional requests and HEAD ---------------------------------------------------------


async def test_polls_are_answered_304_until_the_feed_changes(client: httpx.AsyncClient) -> None:
    _, slots = await make_slots(client, capacity=1)
    patient = new_id()
    assert (await book(client, slots[0]["id"], patient)).status_code == 201
    path = await patient_link(client, patient)
    first = await client.get(path)
    etag, modified = first.headers["etag"], first.headers["last-modified"]
    assert first.headers["cache-control"].startswith("private, max-age=")
    head = await client.head(path)
    assert head.status_code == 200 and head.content == b""
    assert head.headers["etag"] == etag
    assert head.headers["content-length"] == str(len(first.content))
    for headers in ({"If-None-Match": etag}, {"If-Modified-Since": modified}):
        r = await client.get(path, headers=headers)
        assert r.status_code == 304 and r.content == b"" and r.headers["etag"] == etag
    assert (await client.get(path, headers={"If-None-Match": '"other"'})).status_code == 200
    # A booking changes the feed: new ETag, the old one gets the whole feed again.
    assert (await book(client, slots[2]["id"], patient)).status_code == 201
    r = await client.get(path, headers={"If-None-Match": etag})
    assert r.status_code == 200 and r.headers["etag"] != etag
    assert len(icalendar.Calendar.from_ical(r.content).walk("VEVENT")) == 2


# -- the cache bound -----------------------------------------------------------------------


@pytest.fixture
def base_settings(base_settings: Settings) -> Settings:
    """200 polls released at once keep one event loop busy for a while: on a
    loaded machine a Redis answer can wait past the production timeout (0.25 s),
    and a Redis read that times out fails open to PostgreSQL, by design. What
    is asserted here is the cache bound, so Redis gets time to answer."""
    return base_settings.with_(redis_timeout_s=2.0)


async def poll_together(client: httpx.AsyncClient, paths: list[str], n: int) -> None:
    gate = asyncio.Event()

    async def one(path: str) -> int:
        await gate.wait()
        return (await client.get(path)).status_code

    tasks = [asyncio.create_task(one(p)) for p in paths for _ in range(n)]
    await asyncio.sleep(0.05)
    gate.set()
    assert set(await asyncio.gather(*tasks)) == {200}


@pytest.fixture
async def second_app(
    base_settings: Settings, clock: OffsetClock
) -> AsyncIterator[tuple[httpx.AsyncClient, Container]]:
    """Another API process's app on the same PostgreSQL and Redis."""
    container = build(base_settings, clock)
    transport = httpx.ASGITransport(app=create_app(container))
    async with httpx.AsyncClient(transport=transport, base_url="http://reservo.test") as c:
        yield c, container
    await container.close()


async def test_concurrent_polls_read_postgresql_once_per_feed_until_a_change(
    client: httpx.AsyncClient,
    container: Container,
    second_app: tuple[httpx.AsyncClient, Container],
) -> None:
    doctor, slots = await make_slots(client, capacity=1)
    patient = new_id()
    assert (await book(client, slots[0]["id"], patient)).status_code == 201
    feeds = [await patient_link(client, patient), await link(client, "doctor", doctor, ADMIN)]
    statements = Statements(container)

    # 2 x 100 polls released together: one statement per feed, nothing else.
    await poll_together(client, feeds, 100)
    assert len(statements.take()) == 2
    await poll_together(client, feeds, 50)
    assert statements.take() == []
    # Redis keeps it at most the cache life.
    ttl = await container.cache.gate.client.pttl(
        container.cache.value_key(feed_key("patient", patient))
    )
    assert 0 < ttl <= container.settings.appointments.calendar_cache_life_s * 1000

    # Another process is served from Redis: no statement there either.
    other, other_container = second_app
    other_statements = Statements(other_container)
    await poll_together(other, feeds, 50)
    assert other_statements.take() == []

    # A booking of that patient with that doctor drops both: one statement each again.
    assert (await book(client, slots[2]["id"], patient)).status_code == 201
    statements.take()  # the booking's own
    await poll_together(client, feeds, 100)
    assert len(statements.take()) == 2
    for path in feeds:
        assert len(await events(client, path)) == 2
    assert statements.take() == []
