"""The only place that runs the appointments module's SQL."""

from __future__ import annotations

from collections.abc import Sequence
from datetime import date, datetime, time
from typing import TypeAlias

import asyncpg

from reservo.core.db.database import Queries

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
    overbook_limit: int = 0,
    prepaid: tuple[int, str, int] | None = None,
    rules: tuple[int, int | None] = (0, None),
) -> int:
    """``prepaid``: (amount, currency, hold minutes) of a prepaid schedule;
    ``rules``: its minimum notice and daily limit (domain.BookingRules)."""
    price = prepaid or (None, None, None)
    status = await conn.execute(
        Q.insert_slots, doctor_id, starts, ends, capacity, opens, overbook_limit, *price, *rules
    )
    return int(status.split()[-1])


async def available_slots_json(
    conn: asyncpg.Connection, wanted: Sequence[tuple[int, datetime, datetime]], now: datetime
) -> list[tuple[bytes, datetime | None, datetime | None]]:
    """For each (doctor, day start, day end) wanted, in that order: the list's
    JSON, its earliest start and when its next slot opens."""
    rows = await conn.fetch(
        Q.available_slots_json,
        [doctor_id for doctor_id, _, _ in wanted],
        [start for _, start, _ in wanted],
        [end for _, _, end in wanted],
        now,
    )
    return [(row["body"].encode(), row["first_start"], row["next_open"]) for row in rows]


async def book(
    conn: asyncpg.Connection, slot_id: int, patient_id: int, now: datetime, notice: bool = False
) -> Row | None:
    """``notice``: a patient's booking, bound by the slot's minimum notice."""
    return await conn.fetchrow(Q.book, slot_id, patient_id, now, notice)


async def overbook(
    conn: asyncpg.Connection,
    slot_id: int,
    patient_id: int,
    now: datetime,
    doctor_id: int | None,
) -> Row | None:
    return await conn.fetchrow(Q.overbook, slot_id, patient_id, now, doctor_id)


async def slot_state(
    conn: asyncpg.Connection, slot_id: int, patient_id: int, now: datetime
) -> Row | None:
    return await conn.fetchrow(Q.slot_state, slot_id, patient_id, now)


async def get_appointment(conn: asyncpg.Connection, appointment_id: int) -> Row | None:
    return await conn.fetchrow(Q.get_appointment, appointment_id)


async def cancel(conn: asyncpg.Connection, appointment_id: int, now: datetime) -> Row | None:
    return await conn.fetchrow(Q.cancel, appointment_id, now)


async def set_reminder_job(conn: asyncpg.Connection, appointment_id: int, job_id: int) -> None:
    await conn.execute(Q.set_reminder_job, appointment_id, job_id)


async def reminder_job_of(conn: asyncpg.Connection, appointment_id: int) -> int | None:
    job_id: int | None = await conn.fetchval(Q.reminder_job_of, appointment_id)
    return job_id


async def mark_reminded(conn: asyncpg.Connection, appointment_id: int, now: datetime) -> Row | None:
    return await conn.fetchrow(Q.mark_reminded, appointment_id, now)


async def patient_appointments(
    conn: asyncpg.Connection,
    patient_id: int,
    status: str | None,
    after: tuple[datetime, int],
    limit: int,
    now: datetime,
) -> list[Row]:
    """``status`` is the effective one: a hold past its end is EXPIRED."""
    return list(
        await conn.fetch(Q.patient_appointments, patient_id, status, after[0], after[1], limit, now)
    )


async def agenda_slots(
    conn: asyncpg.Connection, doctor_id: int, start: datetime, end: datetime
) -> list[Row]:
    return list(await conn.fetch(Q.agenda_slots, doctor_id, start, end))


async def agenda_appointments(conn: asyncpg.Connection, slot_ids: list[int]) -> list[Row]:
    return list(await conn.fetch(Q.agenda_appointments, slot_ids))


async def cancel_for_reschedule(
    conn: asyncpg.Connection, appointment_id: int, now: datetime
) -> Row | None:
    return await conn.fetchrow(Q.cancel_for_reschedule, appointment_id, now)


async def lock_slots(conn: asyncpg.Connection, slot_ids: list[int]) -> None:
    await conn.fetch(Q.lock_slots, slot_ids)


async def release_seat(conn: asyncpg.Connection, slot_id: int, overbooked: bool) -> int:
    doctor_id: int = await conn.fetchval(Q.release_seat, slot_id, overbooked)
    return doctor_id


async def set_rescheduled_from(conn: asyncpg.Connection, appointment_id: int, old: int) -> int:
    """Returns the first appointment of the chain (the events' key)."""
    lineage: int = await conn.fetchval(Q.set_rescheduled_from, appointment_id, old)
    return lineage


async def join_waitlist(
    conn: asyncpg.Connection, slot_id: int, patient_id: int, now: datetime
) -> Row | None:
    return await conn.fetchrow(Q.join_waitlist, slot_id, patient_id, now)


async def waitlist_position(conn: asyncpg.Connection, slot_id: int, entry_id: int) -> int:
    position: int = await conn.fetchval(Q.waitlist_position, slot_id, entry_id)
    return position


async def leave_waitlist(conn: asyncpg.Connection, slot_id: int, patient_id: int) -> bool:
    return await conn.fetchval(Q.leave_waitlist, slot_id, patient_id) is not None


async def waitlist_of_slot(conn: asyncpg.Connection, slot_id: int, limit: int) -> list[Row]:
    rows: list[Row] = await conn.fetch(Q.waitlist_of_slot, slot_id, limit)
    return rows


async def slot_exists(conn: asyncpg.Connection, slot_id: int) -> bool:
    found: bool = await conn.fetchval(Q.slot_exists, slot_id)
    return found


async def first_waiting(conn: asyncpg.Connection, slot_id: int, now: datetime) -> Row | None:
    return await conn.fetchrow(Q.first_waiting, slot_id, now)


async def drop_waiting(conn: asyncpg.Connection, entry_id: int) -> None:
    await conn.execute(Q.drop_waiting, entry_id)


async def insert_repeating_schedule(
    conn: asyncpg.Connection,
    doctor_id: int,
    fields: tuple[date, list[int], time, time, int, int, int],
    prepaid: tuple[int, str, int] | None,
    rules: tuple[int, int | None],
    generated_until: date,
    now: datetime,
) -> Row:
    """``fields``: first day, weekdays, start and end time, slot minutes, capacity,
    overbook limit; ``prepaid``: (amount, currency, hold minutes) or None;
    ``rules``: minimum notice and daily limit."""
    price = prepaid or (None, None, None)
    return await conn.fetchrow(
        Q.insert_repeating_schedule, doctor_id, *fields, *price, *rules, generated_until, now
    )


async def due_schedule_ids(
    conn: asyncpg.Connection, now: datetime, horizon_days: int, limit: int, bound: date
) -> list[int]:
    return [r["id"] for r in await conn.fetch(Q.due_schedule_ids, now, horizon_days, limit, bound)]


async def schedules_by_id(conn: asyncpg.Connection, ids: Sequence[int], now: datetime) -> list[Row]:
    return list(await conn.fetch(Q.schedules_by_id, list(ids), now))


async def park_schedule(
    conn: asyncpg.Connection, schedule_id: int, now: datetime, reason: str
) -> None:
    await conn.execute(Q.park_schedule, schedule_id, now, reason)


async def set_generated_until(conn: asyncpg.Connection, schedule_id: int, until: date) -> None:
    await conn.execute(Q.set_generated_until, schedule_id, until)


async def mark_no_show(
    conn: asyncpg.Connection, appointment_id: int, doctor_id: int | None, now: datetime
) -> Row | None:
    return await conn.fetchrow(Q.mark_no_show, appointment_id, doctor_id, now)


async def lock_patient_policy(conn: asyncpg.Connection, patient_id: int) -> datetime | None:
    cleared_at: datetime | None = await conn.fetchval(Q.lock_patient_policy, patient_id)
    return cleared_at


async def apply_no_show_policy(
    conn: asyncpg.Connection,
    patient_id: int,
    since: datetime,
    policy: tuple[int, int],
    cleared_at: datetime | None,
) -> datetime | None:
    """``policy``: the limit and the block's days."""
    blocked_until: datetime | None = await conn.fetchval(
        Q.apply_no_show_policy, patient_id, since, *policy, cleared_at
    )
    return blocked_until


async def clear_no_shows(conn: asyncpg.Connection, patient_id: int, now: datetime) -> None:
    await conn.execute(Q.clear_no_shows, patient_id, now)


async def no_show_standing(conn: asyncpg.Connection, patient_id: int, now: datetime) -> Row:
    row: Row = await conn.fetchrow(Q.no_show_standing, patient_id, now)
    return row


async def put_calendar_link(
    conn: asyncpg.Connection, kind: str, owner_id: int, token_sha256: bytes, now: datetime
) -> None:
    await conn.execute(Q.put_calendar_link, kind, owner_id, token_sha256, now)


async def calendar_link_owner(conn: asyncpg.Connection, token_sha256: bytes) -> Row | None:
    return await conn.fetchrow(Q.calendar_link_owner, token_sha256)


async def calendar_feed(
    conn: asyncpg.Connection, kind: str, owner_id: int, since: datetime
) -> list[Row]:
    return list(await conn.fetch(Q.calendar_feed, owner_id, since, kind))


# -- prepaid appointments (0054) ------------------------------------------------------


async def expire_holds_of(
    conn: asyncpg.Connection, slot_id: int, patient_id: int, now: datetime
) -> list[Row]:
    return list(await conn.fetch(Q.expire_holds_of, slot_id, patient_id, now))


async def expire_hold(conn: asyncpg.Connection, appointment_id: int, now: datetime) -> Row | None:
    return await conn.fetchrow(Q.expire_hold, appointment_id, now)


async def sweep_holds(conn: asyncpg.Connection, now: datetime, limit: int) -> list[Row]:
    return list(await conn.fetch(Q.sweep_holds, now, limit))


async def first_hold_end(conn: asyncpg.Connection, slot_id: int) -> datetime | None:
    end: datetime | None = await conn.fetchval(Q.first_hold_end, slot_id)
    return end


async def insert_payment(
    conn: asyncpg.Connection, appointment_id: int, txn_id: str, amount: int, now: datetime
) -> int | None:
    """The new payment's id; None when that transaction was recorded already, or
    the appointment does not exist."""
    payment_id: int | None = await conn.fetchval(
        Q.insert_payment, appointment_id, txn_id, amount, now
    )
    return payment_id


async def confirm_hold(
    conn: asyncpg.Connection, appointment_id: int, amount: int, now: datetime
) -> Row | None:
    return await conn.fetchrow(Q.confirm_hold, appointment_id, amount, now)


async def set_overpaid_refund(conn: asyncpg.Connection, appointment_id: int, amount: int) -> None:
    await conn.execute(Q.set_overpaid_refund, appointment_id, amount)


async def settle_payment(
    conn: asyncpg.Connection, payment_id: int, due: int, refund: int, outcome: str
) -> None:
    await conn.execute(Q.settle_payment, payment_id, due, refund, outcome)


async def refund_recorded(conn: asyncpg.Connection, txn_id: str) -> bool:
    return bool(await conn.fetchval(Q.refund_recorded, txn_id))


async def insert_refund(
    conn: asyncpg.Connection,
    appointment_id: int,
    txn_id: str,
    amount: int,
    gateway_ref: str,
    now: datetime,
) -> bool:
    found = await conn.fetchval(Q.insert_refund, appointment_id, txn_id, amount, gateway_ref, now)
    return found is not None


# -- booking rules and series (0057) ---------------------------------------------------


async def lock_patient_day(
    conn: asyncpg.Connection, doctor_id: int, patient_id: int, day: date, now: datetime
) -> None:
    await conn.execute(Q.lock_patient_day, doctor_id, patient_id, day, now)


async def count_patient_day(
    conn: asyncpg.Connection,
    doctor_id: int,
    patient_id: int,
    bounds: tuple[datetime, datetime],
    now: datetime,
) -> int:
    n: int = await conn.fetchval(Q.count_patient_day, doctor_id, patient_id, *bounds, now)
    return n


async def insert_series(conn: asyncpg.Connection, patient_id: int, now: datetime) -> int:
    series_id: int = await conn.fetchval(Q.insert_series, patient_id, now)
    return series_id


async def set_series(conn: asyncpg.Connection, series_id: int, appointment_ids: list[int]) -> None:
    await conn.execute(Q.set_series, series_id, appointment_ids)


async def series_patient(conn: asyncpg.Connection, series_id: int) -> int | None:
    patient_id: int | None = await conn.fetchval(Q.get_series, series_id)
    return patient_id


async def series_appointments(conn: asyncpg.Connection, series_id: int) -> list[Row]:
    return list(await conn.fetch(Q.series_appointments, series_id))


async def lock_slots_for_series(conn: asyncpg.Connection, slot_ids: list[int]) -> list[Row]:
    return list(await conn.fetch(Q.lock_slots_for_series, slot_ids))


async def slot_change_marks(conn: asyncpg.Connection) -> tuple[int, int, str]:
    """The newest outbox id and slot id, and the snapshot they were read in:
    where the change feed starts."""
    row = await conn.fetchrow(Q.slot_change_marks)
    assert row is not None
    return row["event_id"], row["slot_id"], row["snapshot"]


async def slot_changes_since(
    conn: asyncpg.Connection,
    back: tuple[int, int],
    last: tuple[int, int, str],
    topics: Sequence[str],
) -> tuple[int, int, str, list[int]]:
    """The changes the last poll (``last``: its marks and snapshot) did not see
    among the rows after the look-back's marks ``back``: the next marks, this
    snapshot, and the doctors whose slot lists the events of ``topics`` and
    the slots written changed."""
    row = await conn.fetchrow(Q.slot_changes_since, *back, *last, list(topics))
    assert row is not None
    return row["event_id"], row["slot_id"], row["snapshot"], list(row["doctors"])
