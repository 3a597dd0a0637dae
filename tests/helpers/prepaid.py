"""Builders shared by the prepaid appointment tests: a prepaid schedule, the
signed payment webhook for an appointment, and what was refunded."""

from __future__ import annotations

import uuid
from datetime import date, timedelta
from typing import Any

import asyncpg
import httpx
import orjson

from reservo.appointments.payments import SUBJECT
from reservo.appointments.setup import Appointments
from reservo.bootstrap import Container
from reservo.core.http.auth import sign_webhook
from reservo.core.kernel.clock import Clock
from reservo.core_modules import Outbox
from reservo.rentals.gateway import SandboxGateway
from tests.helpers.appointments import make_doctor, schedule_day, slot_list
from tests.helpers.auth import PAY_SECRET
from tests.helpers.waiting import drain

PRICE = 5000
REFUND_ROWS = (
    "SELECT amount FROM appointment_payment WHERE appointment_id = $1 AND type = 'REFUND' "
    "ORDER BY id"
)


async def prepaid_slots(
    client: httpx.AsyncClient,
    *,
    capacity: int = 1,
    hold_minutes: int | None = None,
    days_ahead: int = 2,
    price: int = PRICE,
) -> tuple[int, list[dict[str, Any]]]:
    """A doctor with four 15-minute prepaid slots of ``capacity``, and their list."""
    doctor = await make_doctor(client)
    day = date.today() + timedelta(days=days_ahead)
    prepaid: dict[str, Any] = {"amount": price, "currency": "EUR"}
    if hold_minutes is not None:
        prepaid["holdMinutes"] = hold_minutes
    await schedule_day(client, doctor, day, capacity=capacity, prepaid=prepaid)
    return doctor, await slot_list(client, doctor, day)


def signed(body: dict[str, Any], clock: Clock, secret: str = PAY_SECRET) -> tuple[bytes, str]:
    raw = orjson.dumps(body)
    return raw, sign_webhook(secret, raw, int(clock.now().timestamp()))


async def pay(
    client: httpx.AsyncClient,
    clock: Clock,
    appointment_id: int,
    amount: int,
    txn: str | None = None,
) -> httpx.Response:
    raw, sig = signed(
        {
            "appointmentId": appointment_id,
            "providerTxnId": txn or f"txn-{uuid.uuid4().hex}",
            "amount": amount,
            "status": "SUCCEEDED",
        },
        clock,
    )
    return await client.post(
        "/api/payments/webhook",
        content=raw,
        headers={"X-Signature": sig, "Content-Type": "application/json"},
    )


async def refunded(container: Container, db: asyncpg.Connection, appointment_id: int) -> list[int]:
    """Runs the relay until nothing is left (the refund consumer executes the
    refund events), then the REFUND rows of the appointment, checked against
    what the sandbox gateway was asked to pay back."""
    await drain(container.module(Outbox).relay)
    await drain(container.module(Outbox).relay)
    rows = [a for (a,) in await db.fetch(REFUND_ROWS, appointment_id)]
    gateway = container.module(Appointments).service.gateway
    assert isinstance(gateway, SandboxGateway)
    asked = [
        r.amount
        for r in gateway.refunds.values()
        if r.booking_id == appointment_id and r.subject == SUBJECT
    ]
    assert sorted(asked) == sorted(rows)
    return rows


async def events_of(db: asyncpg.Connection, topic: str, appointment_id: int) -> int:
    return int(
        await db.fetchval(
            "SELECT count(*) FROM outbox WHERE topic = $1 AND payload->>'appointmentId' = $2",
            topic,
            str(appointment_id),
        )
    )


async def seat_counts(db: asyncpg.Connection, slot_id: int) -> tuple[int, int, int]:
    """(booked_count, HELD rows, BOOKED rows) of the slot: the counter must be
    the sum of the two."""
    row = await db.fetchrow(
        """SELECT s.booked_count,
                  count(a.id) FILTER (WHERE a.status = 'HELD') AS held,
                  count(a.id) FILTER (WHERE a.status = 'BOOKED') AS booked
             FROM time_slot s LEFT JOIN appointment a ON a.slot_id = s.id
            WHERE s.id = $1 GROUP BY s.id""",
        slot_id,
    )
    assert row is not None
    return row["booked_count"], row["held"], row["booked"]
