"""People: patients and customers found by user id or by part of their e-mail.

A user id is global (notifications.contacts): the same person may hold appointments
(patient), car bookings (customer) and wallet accounts. Their e-mail lives in
one place, the contact notifications are sent to (``PUT
/api/patients/{id}/contact``). So one lookup serves both: each person found
shows their contact, links to their appointments and to their bookings when
they have any, and their wallet accounts. A patient's appointments are a keyset
list of the appointments service's ``patient_appointments``, the use case of
``GET /api/patients/{id}/appointments``."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import date
from typing import Annotated, Any

import asyncpg
from fastapi import APIRouter, Query, Request
from fastapi.responses import HTMLResponse

from reservo.appointments import Appointment, AppointmentService
from reservo.console import repo
from reservo.console.finder import PAGE, Cursor, Found, Text, show
from reservo.console.web import SignedIn, render, render_refused, site
from reservo.core.http.pagination import decode_cursor, page, time_cursor, time_key
from reservo.core.http.schemas import MAX_ID
from reservo.core.kernel import timezones
from reservo.core.kernel.errors import DomainError, validation_error

router = APIRouter(prefix="/console", include_in_schema=False)
ACCOUNTS_SHOWN = 10  # a person's wallet accounts on the page (one per currency)


@dataclass(frozen=True)
class Person:
    id: int
    email: str | None
    phone: str | None
    patient: bool  # has appointments
    customer: bool  # has car bookings
    accounts: list[Any]  # wallet accounts: id, currency, balance

    @property
    def known(self) -> bool:
        """Whether reservo holds anything about this id."""
        return bool(self.email or self.phone or self.patient or self.customer or self.accounts)


async def _people(conn: asyncpg.Connection, ids: list[int]) -> list[Person]:
    rows = await repo.people(conn, ids)
    accounts: dict[int, list[Any]] = {}
    for a in await repo.wallet_accounts_of(conn, ids, ACCOUNTS_SHOWN):
        accounts.setdefault(a["owner_id"], []).append(a)
    return [
        Person(
            r["user_id"],
            r["email"],
            r["phone"],
            r["patient"],
            r["customer"],
            accounts.get(r["user_id"], []),
        )
        for r in rows
    ]


def _user_id(text: str) -> int:
    """A text of digits is a user id; 422 for one no bigint holds."""
    user_id = int(text)
    if not 1 <= user_id <= MAX_ID:
        raise validation_error(
            f"{text[:40]} is no user id: ids run from 1 to {MAX_ID}",
            [{"loc": ["query", "q"], "msg": "not a user id", "type": "value_error"}],
        )
    return user_id


@router.get("/people", response_class=HTMLResponse)
async def people(
    request: Request, session: SignedIn, q: Text = "", after: Cursor = None
) -> HTMLResponse:
    """A user id (digits) finds that person when reservo holds anything about
    them; any other text finds the people whose e-mail contains it, by id."""

    async def read(text: str) -> Found:
        if text.isdecimal() and text.isascii():
            user_id = _user_id(text)
            async with site(request).db.connection() as conn:
                found = await _people(conn, [user_id])
            return [p for p in found if p.known], None
        position = decode_cursor(after, int)[0] if after else 0
        async with site(request).db.connection() as conn:
            ids = await repo.find_contacts(conn, text, position, PAGE + 1)
            return page(await _people(conn, ids), PAGE, lambda p: p.id)

    return await show(request, session, "people.html", q, read)


# -- a patient's appointments ------------------------------------------------------


@dataclass(frozen=True)
class Visit:
    """An appointment as the patient's list shows it: with its doctor's name and
    the doctor's local date (the agenda's day)."""

    appt: Appointment
    doctor: str
    day: date


def _local_day(appt: Appointment, doctor: Any) -> date:
    try:
        return appt.start_at.astimezone(timezones.zone(doctor["timezone"])).date()
    except (TypeError, ValueError):  # no such doctor row, or a zone before the rule
        return appt.start_at.date()


async def _visits(request: Request, appts: list[Appointment]) -> list[Visit]:
    async with site(request).db.connection() as conn:
        doctors = await repo.doctors_by_id(conn, sorted({a.doctor_id for a in appts}))
    return [
        Visit(a, d["name"] if d else f"doctor {a.doctor_id}", _local_day(a, d))
        for a in appts
        for d in (doctors.get(a.doctor_id),)
    ]


def _key(v: Visit) -> tuple[int, int]:
    return time_key(v.appt.start_at, v.appt.id)


@router.get("/clinic/appointments", response_class=HTMLResponse)
async def patient_appointments(
    request: Request,
    session: SignedIn,
    patient: Annotated[int, Query(ge=1, le=MAX_ID)],
    after: Cursor = None,
) -> HTMLResponse:
    """The patient's appointments, soonest first, cancelled ones and no-shows
    included, with their no-shows as the policy counts them."""
    appointments: AppointmentService = request.app.state.appointments
    context: dict[str, Any] = {"patient": patient, "items": [], "next": None}
    try:
        cursor = time_cursor(after)
    except DomainError as err:
        return render_refused(request, "patient.html", session, err, **context)
    appts = await appointments.patient_appointments(patient, None, cursor, PAGE + 1)
    context["items"], context["next"] = page(await _visits(request, appts), PAGE, _key)
    context["standing"] = await appointments.no_show_standing(patient)
    return render(request, "patient.html", session, error=None, **context)
