"""Why a write on a slot or an appointment changed nothing: read in the same
transaction, so the answer is about the state the write saw."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

import asyncpg

from reservo.appointments import domain, repo
from reservo.core.kernel import metrics
from reservo.core.kernel.errors import DomainError


async def slot_refusal(
    conn: asyncpg.Connection,
    slot_id: int,
    patient_id: int,
    now: Any,
    seats: tuple[str, str],
    doctor_id: int | None = None,
    notice: bool = False,
) -> DomainError:
    """Why a booking or a waitlist join on the slot wrote nothing, read in the same
    transaction; ``seats`` (code, detail) when only the seats stand in the way
    (the slot is full for a booking, has room left for the waitlist).
    ``doctor_id``: a doctor acting on the slot, for whom another doctor's slot
    does not exist (a 403 would tell which ids exist). ``notice``: a patient's
    booking, bound by the slot's minimum notice."""
    state = await repo.slot_state(conn, slot_id, patient_id, now)
    if state is None or doctor_id not in (None, state["doctor_id"]):
        return DomainError("slot_not_found", f"no slot {slot_id}")
    if state["blocked_until"] is not None:
        return no_show_blocked(state["blocked_until"])
    if state["mine"]:
        return DomainError("already_booked", "you already hold a booking in this slot")
    if state["start_at"] <= now:
        return DomainError("slot_in_past", "this slot has already started")
    if notice and domain.too_late(state["start_at"], now, state["min_notice_minutes"]):
        return DomainError(
            "too_late_to_book",
            f"this slot is booked at least {state['min_notice_minutes']} minutes before its start",
        )
    if state["opens_at"] > now:
        return DomainError(
            "slot_not_open", f"this slot opens for booking at {state['opens_at'].isoformat()}"
        )
    return DomainError(*seats)


async def booking_refusal(
    conn: asyncpg.Connection, slot_id: int, patient_id: int, now: Any, notice: bool
) -> DomainError:
    """Why a conditional booking of the slot matched no row (a single booking, a
    reschedule's new slot, one slot of a series), counted as a conflict."""
    refusal = await slot_refusal(
        conn,
        slot_id,
        patient_id,
        now,
        ("slot_full", "this slot has no capacity left"),
        notice=notice,
    )
    metrics.CONFLICTS.labels("appointments", refusal.code, "database").inc()
    return refusal


def no_show_blocked(until: datetime) -> DomainError:
    return DomainError(
        "no_show_limit",
        "too many missed appointments: booking is blocked until "
        f"{until.astimezone(UTC).isoformat()} (an admin may lift it)",
    )


async def no_show_refusal(
    conn: asyncpg.Connection, appointment_id: int, doctor_id: int | None, now: datetime
) -> DomainError:
    """Why marking a no-show changed nothing; another doctor's appointment does
    not exist for the caller."""
    row = await repo.get_appointment(conn, appointment_id)
    if row is None or doctor_id not in (None, row["doctor_id"]):
        return DomainError("appointment_not_found", f"no appointment {appointment_id}")
    if row["status"] != "BOOKED":
        return DomainError("not_booked", f"the appointment is {row['status']}")
    return DomainError(
        "not_started",
        f"the slot starts at {row['start_at'].astimezone(UTC).isoformat()}: "
        "a no-show is marked after the start",
    )


def daily_limit(limit: int) -> DomainError:
    return DomainError(
        "daily_limit", f"at most {limit} appointments a day with this doctor per patient"
    )


async def not_reschedulable(conn: asyncpg.Connection, appointment_id: int) -> DomainError:
    row = await repo.get_appointment(conn, appointment_id)
    if row is None:
        return DomainError("appointment_not_found", f"no appointment {appointment_id}")
    if row["status"] != "BOOKED":
        return DomainError("not_reschedulable", f"the appointment is {row['status']}")
    return DomainError("not_reschedulable", "the appointment has already started")
