"""Idempotency-Key semantics (docs/openapi.json) on POST /api/appointments, plus
retention.

Each test runs on a single Redis and on a Redis Cluster (the Redis filter
in front of the database: its rate limit, full and seen marks)."""

from __future__ import annotations

import uuid
from datetime import timedelta

import asyncpg
import httpx
import pytest

from reservo.bootstrap import Container, declared_retention
from reservo.core.http.auth import mint_token
from reservo.core.http.idempotency import Claim, Replay
from reservo.core.kernel.clock import OffsetClock
from reservo.core.maintenance.retention import Pruner, RuleResult
from tests.helpers.appointments import book, make_slots
from tests.helpers.auth import ADMIN, JWT_SECRET, auth, new_id

pytestmark = pytest.mark.redis_cluster

ENDPOINT = "POST /api/appointments"


def idem() -> str:
    return f"k-{uuid.uuid4()}"


async def appointments_of(db: asyncpg.Connection, patient: int) -> list[asyncpg.Record]:
    return list(
        await db.fetch(
            "SELECT id, slot_id, status FROM appointment WHERE patient_id = $1 ORDER BY id",
            patient,
        )
    )


async def booked_count(db: asyncpg.Connection, slot_id: int) -> int:
    n: int = await db.fetchval("SELECT booked_count FROM time_slot WHERE id = $1", slot_id)
    return n


async def test_a_replay_returns_the_same_body_with_200(
    client: httpx.AsyncClient, db: asyncpg.Connection
) -> None:
    _, slots = await make_slots(client, capacity=2)
    patient, k = new_id(), idem()
    first = await book(client, slots[0]["id"], patient, k)
    assert first.status_code == 201
    again = await book(client, slots[0]["id"], patient, k)
    assert again.status_code == 200
    assert again.headers["content-type"].startswith("application/json")
    assert again.json() == first.json()
    assert list(again.json()) == list(first.json())  # same fields, same order
    assert len(await appointments_of(db, patient)) == 1
    assert await booked_count(db, slots[0]["id"]) == 1


async def test_a_replay_ignores_json_key_order_and_spacing(
    client: httpx.AsyncClient, db: asyncpg.Connection
) -> None:
    _, slots = await make_slots(client, capacity=2)
    patient, k = new_id(), idem()
    first = await book(client, slots[0]["id"], patient, k)
    assert first.status_code == 201
    raw = f'{{ "patientId" : {patient},   "slotId": {slots[0]["id"]} }}'.encode()
    headers = {**auth("patient", patient), "Idempotency-Key": k, "Content-Type": "application/json"}
    again = await client.post("/api/appointments", content=raw, headers=headers)
    assert again.status_code == 200 and again.json() == first.json()
    assert len(await appointments_of(db, patient)) == 1


async def test_same_key_with_a_different_body_is_refused_and_books_nothing(
    client: httpx.AsyncClient, db: asyncpg.Connection
) -> None:
    _, slots = await make_slots(client, capacity=2)
    patient, k = new_id(), idem()
    first = await book(client, slots[0]["id"], patient, k)
    assert first.status_code == 201
    r = await book(client, slots[1]["id"], patient, k)
    assert r.status_code == 422 and r.json()["code"] == "idempotency_key_reused"
    assert [a["id"] for a in await appointments_of(db, patient)] == [first.json()["id"]]
    assert await booked_count(db, slots[1]["id"]) == 0
    # The original body still replays.
    assert (await book(client, slots[0]["id"], patient, k)).json() == first.json()


async def test_keys_are_scoped_to_the_caller(
    client: httpx.AsyncClient, db: asyncpg.Connection
) -> None:
    _, slots = await make_slots(client, capacity=3)
    alice, bob, k = new_id(), new_id(), idem()
    a = await book(client, slots[0]["id"], alice, k)
    b = await book(client, slots[0]["id"], bob, k)
    assert (a.status_code, b.status_code) == (201, 201)
    assert a.json()["id"] != b.json()["id"]
    assert a.json()["patientId"] == alice and b.json()["patientId"] == bob
    assert await booked_count(db, slots[0]["id"]) == 2
    # An admin using the same key for alice is yet another caller: a fresh request
    # (which alice already holds, so it is refused, not replayed).
    r = await client.post(
        "/api/appointments",
        json={"slotId": slots[0]["id"], "patientId": alice},
        headers={**ADMIN, "Idempotency-Key": k},
    )
    assert r.status_code == 409 and r.json()["code"] == "already_booked"


async def test_keys_are_scoped_to_the_endpoint(container: Container) -> None:
    """The store keeps (caller, endpoint, key) apart: one key on two endpoints is two requests."""
    store, caller, k, body = container.idempotency, f"patient:{new_id()}", idem(), b'{"a": 1}'
    first = await store.begin(caller, ENDPOINT, k, body)
    other = await store.begin(caller, "POST /api/elsewhere", k, body)
    assert isinstance(first, Claim) and isinstance(other, Claim)
    async with container.db.connection() as conn:
        await first.complete(conn, 201, {"where": "appointments"})
        await other.complete(conn, 201, {"where": "elsewhere"})
    assert await store.begin(caller, ENDPOINT, k, body) == Replay(200, {"where": "appointments"})
    assert await store.begin(caller, "POST /api/elsewhere", k, body) == Replay(
        200, {"where": "elsewhere"}
    )


async def test_a_refusal_by_the_redis_filter_is_not_recorded(
    client: httpx.AsyncClient, db: asyncpg.Connection
) -> None:
    """slot_full decided by the Redis full mark never touches the database (the
    point of the filter), so it is not stored under the key: the refused attempt
    created nothing, and a retry with that key is evaluated again."""
    _, slots = await make_slots(client, capacity=1)
    slot_id, holder, late, k = slots[0]["id"], new_id(), new_id(), idem()
    held = await book(client, slot_id, holder)
    assert held.status_code == 201
    refused = await book(client, slot_id, late, k)
    assert refused.status_code == 409 and refused.json()["code"] == "slot_full"
    assert await db.fetchval("SELECT count(*) FROM idempotency_key WHERE key = $1", k) == 0
    assert await appointments_of(db, late) == []
    cancel = await client.delete(f"/api/appointments/{held.json()['id']}", headers=ADMIN)
    assert cancel.status_code == 200
    again = await book(client, slot_id, late, k)
    assert again.status_code == 201
    assert await booked_count(db, slot_id) == 1
    # From now on the key is known: its booking is replayed even though the slot is full.
    replay = await book(client, slot_id, late, k)
    assert replay.status_code == 200 and replay.json() == again.json()


async def test_a_refusal_found_in_the_database_also_replays(
    client: httpx.AsyncClient, db: asyncpg.Connection
) -> None:
    """already_booked is decided by the database (not by the Redis full mark)."""
    _, slots = await make_slots(client, capacity=3)
    slot_id, patient, k = slots[0]["id"], new_id(), idem()
    first = await book(client, slot_id, patient)
    assert first.status_code == 201
    refused = await book(client, slot_id, patient, k)
    assert refused.status_code == 409 and refused.json()["code"] == "already_booked"
    await client.delete(f"/api/appointments/{first.json()['id']}", headers=ADMIN)
    again = await book(client, slot_id, patient, k)
    assert again.status_code == 409 and again.json() == refused.json()
    assert await booked_count(db, slot_id) == 0


async def test_a_retry_after_the_slot_filled_still_gets_its_booking(
    client: httpx.AsyncClient, db: asyncpg.Connection
) -> None:
    """The last seat fills the slot (and sets the Redis full mark); a retry of that
    very booking must get the booking back, not slot_full."""
    _, slots = await make_slots(client, capacity=2)
    slot_id, first, last, k = slots[0]["id"], new_id(), new_id(), idem()
    assert (await book(client, slot_id, first)).status_code == 201
    won = await book(client, slot_id, last, k)
    assert won.status_code == 201
    assert (await book(client, slot_id, new_id())).json()["code"] == "slot_full"
    for _ in range(2):
        retry = await book(client, slot_id, last, k)
        assert retry.status_code == 200 and retry.json() == won.json()
    # A different body under that key is still a misuse, full slot or not.
    misuse = await client.post(
        "/api/appointments",
        json={"slotId": slot_id, "patientId": last, "extra": None},
        headers={**auth("patient", last), "Idempotency-Key": k},
    )
    assert misuse.status_code == 422
    assert await booked_count(db, slot_id) == 2
    assert len(await appointments_of(db, last)) == 1


async def test_a_rate_limited_attempt_is_not_stored(
    client: httpx.AsyncClient, db: asyncpg.Connection
) -> None:
    """429 is a passing refusal: it leaves no stored answer under its key."""
    _, slots = await make_slots(client, capacity=2)
    patient, k = new_id(), idem()
    for _ in range(5):
        await book(client, 2**62, patient)
    r = await book(client, slots[0]["id"], patient, k)
    assert r.status_code == 429
    stored = await db.fetchval(
        "SELECT count(*) FROM idempotency_key WHERE caller = $1 AND key = $2",
        str(patient),
        k,
    )
    assert stored == 0


async def _prune_keys(
    container: Container, clock: OffsetClock, batch: int = 5000
) -> list[RuleResult]:
    """The maintenance role's pruner, with the idempotency keys' rule alone."""
    (rule,) = [r for r in declared_retention(container.settings) if r.table == "idempotency_key"]
    return await Pruner(container.db, clock, [rule], batch=batch, pause_s=0).run()


async def test_prune_drops_keys_older_than_retention_and_keeps_newer_ones(
    client: httpx.AsyncClient, db: asyncpg.Connection, container: Container, clock: OffsetClock
) -> None:
    _, slots = await make_slots(client, capacity=3, days_ahead=4)
    patient = new_id()

    def headers(k: str) -> dict[str, str]:
        tok = mint_token(JWT_SECRET, "patient", patient, timedelta(hours=1), clock.now())
        return {"Authorization": f"Bearer {tok}", "Idempotency-Key": k}

    async def post(slot_id: int, k: str) -> httpx.Response:
        body = {"slotId": slot_id, "patientId": patient}
        return await client.post("/api/appointments", json=body, headers=headers(k))

    async def stored(k: str) -> bool:
        n = await db.fetchval(
            "SELECT count(*) FROM idempotency_key WHERE caller = $1 AND key = $2",
            str(patient),
            k,
        )
        return bool(n)

    old, new = idem(), idem()
    first = await post(slots[0]["id"], old)
    assert first.status_code == 201
    clock.advance(timedelta(hours=23))
    await _prune_keys(container, clock)
    # Kept at least 24 h: still replayed.
    assert await stored(old)
    replay = await post(slots[0]["id"], old)
    assert replay.status_code == 200 and replay.json() == first.json()
    assert (await post(slots[1]["id"], new)).status_code == 201

    clock.advance(timedelta(hours=2))  # old is now 25 h old, new 2 h
    (result,) = await _prune_keys(container, clock, batch=1)  # several batches
    assert result.rows["idempotency_key"] >= 1
    assert not await stored(old)
    assert await stored(new)
    # Once pruned, the old key is a fresh request (refused: the patient holds that slot).
    fresh = await post(slots[0]["id"], old)
    assert fresh.status_code == 409 and fresh.json()["code"] == "already_booked"
