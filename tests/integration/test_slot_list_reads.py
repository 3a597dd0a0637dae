"""Slot lists missed together are read from PostgreSQL together: one statement
for the lists a process misses in one turn (docs/DESIGN.md, "Slot lists: the
misses of one turn in one statement"), each caller still getting its own list,
and its own refusal."""

from __future__ import annotations

import asyncio
from datetime import date, datetime, timedelta

import asyncpg
import httpx
import pytest
from prometheus_client import REGISTRY

from reservo.appointments import repo
from tests.helpers.appointments import make_doctor, schedule_day
from tests.helpers.auth import ADMIN

DAYS = 12


async def test_lists_missed_together_are_read_in_one_statement(
    client: httpx.AsyncClient, monkeypatch: pytest.MonkeyPatch
) -> None:
    doctor = await make_doctor(client, "UTC")
    first = date.today() + timedelta(days=2)
    await schedule_day(client, doctor, first, to=first + timedelta(days=DAYS - 1), minutes=30)
    statements: list[int] = []
    real_read = repo.available_slots_json

    async def counted_read(
        conn: asyncpg.Connection, wanted: list[tuple[int, datetime, datetime]], now: datetime
    ) -> list[tuple[bytes, datetime | None, datetime | None]]:
        statements.append(len(wanted))
        return await real_read(conn, wanted, now)

    monkeypatch.setattr(repo, "available_slots_json", counted_read)
    before = _batches()
    days = [first + timedelta(days=n) for n in range(DAYS)]
    barrier = asyncio.Barrier(DAYS + 1)

    async def read(doctor_id: int, day: date) -> httpx.Response:
        await barrier.wait()
        url = f"/api/doctors/{doctor_id}/slots"
        return await client.get(url, params={"date": day.isoformat()}, headers=ADMIN)

    # Every day's list (none cached yet) and a doctor that does not exist, at once.
    answers = await asyncio.gather(*(read(doctor, d) for d in days), read(doctor + 10_000, first))
    for day, r in zip(days, answers, strict=False):
        assert r.status_code == 200, r.text
        # Its own day's two slots, not another caller's.
        assert [s["startAt"][:10] for s in r.json()] == [day.isoformat()] * 2
        assert {s["doctorId"] for s in r.json()} == {doctor}
    assert (answers[-1].status_code, answers[-1].json()["code"]) == (404, "doctor_not_found")
    # One statement per list before; now the misses of a turn share one.
    assert sum(statements) == DAYS, statements
    assert len(statements) <= 2, statements
    # What the operator sees: the batches and the lists they held (the unknown
    # doctor's too, refused without a statement of its own).
    count, lists = (now - then for now, then in zip(_batches(), before, strict=True))
    assert lists == DAYS + 1 and 1 <= count <= 2, (count, lists)


def _batches() -> tuple[float, float]:
    """reservo_batch_items' count and sum for the slot list reads."""
    labels = {"batch": "slot_list_reads"}
    count = REGISTRY.get_sample_value("reservo_batch_items_count", labels) or 0.0
    total = REGISTRY.get_sample_value("reservo_batch_items_sum", labels) or 0.0
    return count, total
