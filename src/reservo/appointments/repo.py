"""The only place that runs the appointments module's SQL."""

from __future__ import annotations

from datetime import datetime
from typing import Any, TypeAlias

import asyncpg

from reservo.core.db import Queries

Q = Queries.load("reservo.appointments")

Row: TypeAlias = asyncpg.Record


async def insert_doctor(conn: asyncpg.Connection, name: str, tz: str, specialty: str | None) -> Row:
    return await conn.fetchrow(Q.insert_doctor, name, tz, specialty)


async def get_doctor(conn: asyncpg.Connection, doctor_id: int) -> Row | None:
    return await conn.fetchrow(Q.get_doctor, doctor_id)


async def insert_slots(
    conn: asyncpg.Connection,
    doctor_id: int,
    starts: list[datetime],
    ends: list[datetime],
    capacity: int,
    opens: list[datetime],
) -> int:
    status = await conn.execute(Q.insert_slots, doctor_id, starts, ends, capacity, opens)
    return int(status.split()[-1])


async def available_slots(
    conn: asyncpg.Connection, doctor_id: int, start: datetime, end: datetime, now: datetime
) -> list[Row]:
    return list(await conn.fetch(Q.list_available_slots, doctor_id, start, end, now))


async def book(
    conn: asyncpg.Connection, slot_id: int, patient_id: int, now: datetime
) -> Row | None:
    return await conn.fetchrow(Q.book, slot_id, patient_id, now)


async def slot_state(conn: asyncpg.Connection, slot_id: int, patient_id: int) -> Row | None:
    return await conn.fetchrow(Q.slot_state, slot_id, patient_id)


async def get_appointment(conn: asyncpg.Connection, appointment_id: int) -> Row | None:
    return await conn.fetchrow(Q.get_appointment, appointment_id)


async def cancel(conn: asyncpg.Connection, appointment_id: int, now: datetime) -> Row | None:
    return await conn.fetchrow(Q.cancel, appointment_id, now)


def as_dict(row: Row) -> dict[str, Any]:
    return dict(row.items())


async def set_reminder_job(conn: asyncpg.Connection, appointment_id: int, job_id: int) -> None:
    await conn.execute(Q.set_reminder_job, appointment_id, job_id)


async def reminder_job_of(conn: asyncpg.Connection, appointment_id: int) -> int | None:
    job_id: int | None = await conn.fetchval(Q.reminder_job_of, appointment_id)
    return job_id


async def mark_reminded(conn: asyncpg.Connection, appointment_id: int, now: datetime) -> Row | None:
    return await conn.fetchrow(Q.mark_reminded, appointment_id, now)
