"""Read replicas against a real hot standby (``tests/helpers/replication.py``): the reads
allowed to be seconds stale (slot list, car search, match list) go to the
standby, every decision stays on the primary, and a standby that lags past the
bound or dies costs no error.

How a read is shown to come from the standby: its replay is paused
(``pg_wal_replay_pause``), a write commits on the primary, and the answer is the
standby's older view, while the decision taken right after sees the write."""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import AsyncIterator
from datetime import UTC, date, datetime, timedelta
from typing import Any

import httpx
import pytest

from reservo.settings import Settings
from tests.helpers.appointments import book, make_doctor
from tests.helpers.auth import ADMIN, auth, new_id
from tests.helpers.betting import ODDS, make_account, make_match, place
from tests.helpers.replication import (
    HotStandbyPair,
    missing_binaries,
    routed,
    served,
    serving,
    started_pair,
)
from tests.helpers.waiting import wait_until

pytestmark = pytest.mark.timeout(120)

WHY_NOT = missing_binaries()


@pytest.fixture(scope="module")
async def pair() -> AsyncIterator[HotStandbyPair]:
    async with started_pair("reservo-replication-") as p:
        yield p


async def doctor_with_slots(client: httpx.AsyncClient, capacity: int, days: int = 1) -> int:
    doctor = await make_doctor(client)
    first = date.today() + timedelta(days=2)
    r = await client.post(
        f"/api/doctors/{doctor}/schedules",
        headers=ADMIN,
        json={
            "from": first.isoformat(),
            "to": (first + timedelta(days=days - 1)).isoformat(),
            "weekdays": list(range(1, 8)),
            "startTime": "08:00",
            "endTime": "09:00",
            "slotMinutes": 30,
            "capacity": capacity,
        },
    )
    assert r.status_code == 201, r.text
    return doctor


def day(n: int = 0) -> str:
    return (date.today() + timedelta(days=2 + n)).isoformat()


async def slot_list(client: httpx.AsyncClient, doctor: int, on: str) -> list[dict[str, Any]]:
    r = await client.get(f"/api/doctors/{doctor}/slots", params={"date": on}, headers=ADMIN)
    assert r.status_code == 200, r.text
    return list(r.json())


async def test_slot_list_comes_from_the_replica_while_bookings_decide_on_the_primary(
    pair: HotStandbyPair, base_settings: Settings
) -> None:
    async with routed(pair, base_settings, replica_max_lag_s=30.0) as (c, client):
        doctor = await doctor_with_slots(client, capacity=2)
        await pair.caught_up()
        await wait_until(lambda: serving(c))
        slot = (await slot_list(client, doctor, day()))[0]
        patient = new_id()
        await pair.pause_replay()
        try:
            r = await book(client, slot["id"], patient)
            assert r.status_code == 201, r.text
            before = served("replica0", "replica")
            # The booking emptied the cached list; the refill is the paused replica's.
            listed = {s["id"]: s for s in await slot_list(client, doctor, day())}
            assert listed[slot["id"]]["bookedCount"] == 0
            assert listed[slot["id"]]["available"] == 2
            assert served("replica0", "replica") == before + 1
            # The decision is the primary's: it sees the booking the list does not.
            r = await book(client, slot["id"], patient)
            assert (r.status_code, r.json()["code"]) == (409, "already_booked"), r.text
        finally:
            await pair.resume_replay()

        async def shows_the_booking() -> bool:
            listed = {s["id"]: s for s in await slot_list(client, doctor, day())}
            return bool(listed[slot["id"]]["bookedCount"] == 1)

        await wait_until(shows_the_booking)


async def test_a_doctor_the_replica_has_not_seen_yet_is_confirmed_on_the_primary(
    pair: HotStandbyPair, base_settings: Settings
) -> None:
    # Two API processes: the one that created the doctor knows its zone already
    # and would not ask; the other asks, and the paused replica knows no such doctor.
    async with (
        routed(pair, base_settings, replica_max_lag_s=30.0) as (_, writer),
        routed(pair, base_settings, replica_max_lag_s=30.0) as (c, reader),
    ):
        await wait_until(lambda: serving(c))
        await pair.pause_replay()
        try:
            doctor = await doctor_with_slots(writer, capacity=1)
            before = served("primary", "recheck")
            slots = await slot_list(reader, doctor, day())  # 200, not the replica's 404
            assert len(slots) == 2 and served("primary", "recheck") == before + 1
            r = await reader.get(
                f"/api/doctors/{new_id()}/slots", params={"date": day()}, headers=ADMIN
            )
            assert (r.status_code, r.json()["code"]) == (404, "doctor_not_found")
        finally:
            await pair.resume_replay()


async def test_match_list_comes_from_the_replica_while_bets_check_the_primarys_odds(
    pair: HotStandbyPair, base_settings: Settings
) -> None:
    async with routed(pair, base_settings, replica_max_lag_s=30.0) as (c, client):
        match = await make_match(client)
        account, owner = await make_account(client, 1_000)
        await pair.caught_up()
        await wait_until(lambda: serving(c))
        new_odds = {**ODDS, "1X2": {"HOME": "2.50", "DRAW": "3.40", "AWAY": "4.20"}}
        await pair.pause_replay()
        try:
            r = await client.patch(
                f"/api/matches/{match['id']}", json={"odds": new_odds}, headers=ADMIN
            )
            assert r.status_code == 200, r.text
            r = await client.get(
                "/api/matches", params={"status": "UPCOMING", "limit": 200}, headers=ADMIN
            )
            assert r.status_code == 200, r.text
            listed = [m for m in r.json()["items"] if m["id"] == match["id"]]
            assert listed and listed[0]["odds"]["1X2"]["HOME"] == "1.80"  # the replica's view
            # The bet is decided on the primary: the odds the list shows are refused.
            selection = [(match["id"], "1X2", "HOME")]
            r = await place(client, account, owner, 100, selection, ODDS)
            assert (r.status_code, r.json()["code"]) == (409, "odds_changed"), r.text
            r = await place(client, account, owner, 100, selection, new_odds)
            assert r.status_code == 201, r.text
        finally:
            await pair.resume_replay()


async def test_car_search_comes_from_the_replica_while_holds_decide_on_the_primary(
    pair: HotStandbyPair, base_settings: Settings
) -> None:
    async with routed(pair, base_settings, replica_max_lag_s=30.0) as (c, client):
        city = f"city-{new_id()}"
        r = await client.post(
            "/api/cars",
            json={
                "plate": f"R-{uuid.uuid4().hex[:10]}",
                "model": "Fiat Uno",
                "city": city,
                "dailyPrice": 10_000,
                "hostId": new_id(),
            },
            headers=ADMIN,
        )
        assert r.status_code == 201, r.text
        car = r.json()["id"]
        await pair.caught_up()
        await wait_until(lambda: serving(c))
        start = (datetime.now(UTC) + timedelta(days=3)).replace(second=0, microsecond=0)
        period = {"from": start.isoformat(), "to": (start + timedelta(days=1)).isoformat()}

        async def hold(customer: int) -> httpx.Response:
            return await client.post(
                "/api/bookings",
                json={"carId": car, "customerId": customer, **period},
                headers={**auth("customer", customer), "Idempotency-Key": str(uuid.uuid4())},
            )

        await pair.pause_replay()
        try:
            r = await hold(new_id())
            assert r.status_code == 201, r.text
            r = await client.get("/api/cars", params={"city": city, **period}, headers=ADMIN)
            assert r.status_code == 200, r.text
            # The replica has not seen the hold.
            assert [x["id"] for x in r.json()["items"]] == [car]
            r = await hold(new_id())
            assert (r.status_code, r.json()["code"]) == (409, "car_unavailable"), r.text
        finally:
            await pair.resume_replay()


async def test_reads_leave_a_replica_lagging_past_the_bound_and_come_back(
    pair: HotStandbyPair, base_settings: Settings
) -> None:
    max_lag = 1.0
    async with routed(pair, base_settings, replica_max_lag_s=max_lag) as (c, client):
        doctor = await doctor_with_slots(client, capacity=2, days=3)
        await pair.caught_up()
        await wait_until(lambda: serving(c))
        slot = (await slot_list(client, doctor, day()))[0]
        await pair.pause_replay()
        try:
            r = await book(client, slot["id"], new_id())
            assert r.status_code == 201, r.text
            # The replica now misses a commit: it serves until that is max_lag old.
            took = await wait_until(lambda: not serving(c))
            assert took < max_lag + 0.5
            before = served("primary", "replicas_behind")
            listed = {s["id"]: s for s in await slot_list(client, doctor, day())}
            assert listed[slot["id"]]["bookedCount"] == 1  # the primary's view
            assert served("primary", "replicas_behind") == before + 1
            r = await client.get("/readyz")
            assert r.status_code == 200, r.text
            (replica,) = r.json()["replicas"]
            assert replica["up"] and not replica["serving"] and replica["lagSeconds"] > max_lag
        finally:
            await pair.resume_replay()
        await wait_until(lambda: serving(c))
        before = served("replica0", "replica")
        listed = {s["id"]: s for s in await slot_list(client, doctor, day(1))}
        assert served("replica0", "replica") == before + 1


async def test_a_killed_replica_costs_no_error_and_reads_return_to_it(
    pair: HotStandbyPair, base_settings: Settings
) -> None:
    async with routed(pair, base_settings, replica_max_lag_s=2.0) as (c, client):
        await make_match(client)
        await pair.caught_up()
        await wait_until(lambda: serving(c))
        stop = asyncio.Event()
        statuses: list[int] = []

        async def reader() -> None:
            while not stop.is_set():
                r = await client.get("/api/matches", params={"status": "UPCOMING"}, headers=ADMIN)
                statuses.append(r.status_code)

        readers = [asyncio.create_task(reader()) for _ in range(16)]
        killed = restarted = False
        try:
            await asyncio.sleep(0.3)
            assert served("replica0", "replica") > 0
            on_primary = served("primary", "replicas_behind") + served("primary", "replica_failed")
            await asyncio.to_thread(pair.kill_standby)
            killed = True
            await wait_until(lambda: not serving(c))
            r = await client.get("/readyz")
            assert r.status_code == 200 and r.json()["replicas"][0]["up"] is False, r.text
            await asyncio.sleep(0.5)  # reads go on, on the primary
            now_primary = served("primary", "replicas_behind") + served("primary", "replica_failed")
            assert now_primary > on_primary
            await pair.restart_standby()
            restarted = True
            await wait_until(lambda: serving(c))
            back = served("replica0", "replica")
            await wait_until(lambda: served("replica0", "replica") > back)
        finally:
            stop.set()
            await asyncio.gather(*readers)
            if killed and not restarted:
                await pair.restart_standby()
        assert statuses and set(statuses) == {200}, sorted(set(statuses))


async def test_a_read_on_a_replica_that_just_died_is_asked_again_of_the_primary(
    pair: HotStandbyPair, base_settings: Settings
) -> None:
    # Probes far apart: the read finds the replica dead before any probe does.
    settings = {"replica_max_lag_s": 60.0, "replica_probe_interval_s": 30.0}
    async with routed(pair, base_settings, **settings) as (c, client):
        await make_match(client)
        await pair.caught_up()
        assert c.stale.replicas is not None
        await c.stale.replicas.probe()
        assert serving(c)
        await asyncio.to_thread(pair.kill_standby)
        try:
            before = served("primary", "replica_failed")
            r = await client.get("/api/matches", params={"status": "UPCOMING"}, headers=ADMIN)
            assert r.status_code == 200, r.text
            assert served("primary", "replica_failed") == before + 1
            assert not serving(c)  # left out until a probe finds it back
        finally:
            await pair.restart_standby()
        await c.stale.replicas.probe()
        assert serving(c)
