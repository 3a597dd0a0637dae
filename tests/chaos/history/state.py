"""The final state, read by plain SQL (asyncpg, no code of the service): only the
accounts, slots and jobs of the test, so a database shared with other work is
read the same way."""

from __future__ import annotations

from collections import Counter

import asyncpg

from tests.chaos.history.check import (
    Appointment,
    AppointmentState,
    BankState,
    Job,
    JobState,
    Movement,
)


async def read_bank(db: asyncpg.Connection, accounts: list[int]) -> BankState:
    balances = await db.fetch(
        "SELECT id, balance FROM wallet_account WHERE id = ANY($1::bigint[])", accounts
    )
    movements = await db.fetch(
        """SELECT id, kind, from_account_id, to_account_id, amount, reference
             FROM wallet_transfer
            WHERE kind IN ('DEPOSIT', 'TRANSFER')
              AND (to_account_id = ANY($1::bigint[]) OR from_account_id = ANY($1::bigint[]))""",
        accounts,
    )
    return BankState(
        {r["id"]: r["balance"] for r in balances},
        [
            Movement(
                r["id"],
                r["kind"],
                r["from_account_id"],
                r["to_account_id"],
                r["amount"],
                r["reference"],
            )
            for r in movements
        ],
    )


async def read_appointments(db: asyncpg.Connection, slots: list[int]) -> AppointmentState:
    capacity = await db.fetch(
        "SELECT id, capacity FROM time_slot WHERE id = ANY($1::bigint[])", slots
    )
    rows = await db.fetch(
        "SELECT id, slot_id, patient_id, status FROM appointment WHERE slot_id = ANY($1::bigint[])",
        slots,
    )
    return AppointmentState(
        {r["id"]: r["capacity"] for r in capacity},
        [Appointment(r["id"], r["slot_id"], r["patient_id"], r["status"]) for r in rows],
    )


async def read_jobs(db: asyncpg.Connection, prefix: str, calls: Counter[int]) -> JobState:
    """The ``http`` jobs whose payload body carries a ``ref`` starting with
    ``prefix``; ``calls``: what the receiver counted per job id."""
    rows = await db.fetch(
        """SELECT id, status, payload->'body'->>'ref' AS ref FROM scheduled_job
            WHERE category = 'http' AND payload->'body'->>'ref' LIKE $1 || '%'""",
        prefix,
    )
    return JobState([Job(r["id"], r["ref"], r["status"]) for r in rows], calls)
