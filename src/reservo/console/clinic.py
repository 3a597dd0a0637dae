"""The clinic pages: a doctor's day (each slot's seats booked out of its
capacity, its appointments), cancelling an appointment as an admin would through
``DELETE /api/appointments/{id}``, and a slot's waitlist. Reads and the cancel go
through the appointments service, the same use cases as the HTTP API."""

from __future__ import annotations

from datetime import date
from typing import Annotated, Any

from fastapi import APIRouter, Path, Query, Request
from fastapi.responses import HTMLResponse, RedirectResponse

from reservo.appointments import AppointmentService
from reservo.console import repo
from reservo.console.session import Session
from reservo.console.web import (
    SignedIn,
    Verified,
    parse_day,
    render,
    render_refused,
    site,
)
from reservo.core.kernel import timezones
from reservo.core.kernel.errors import DomainError, validation_error

router = APIRouter(prefix="/console", include_in_schema=False)
WAITLIST_SHOWN = 100


def _appointments(request: Request) -> AppointmentService:
    s: AppointmentService = request.app.state.appointments
    return s


def _agenda_url(doctor: int, day: date) -> str:
    return f"/console/clinic?doctor={doctor}&day={day.isoformat()}"


# A query's day as sent, for parse_day (its message quotes at most 40 characters).
DayText = Annotated[str | None, Query(max_length=100)]


def _today(request: Request) -> date:
    return site(request).clock.now().date()


async def _doctor(request: Request, doctor_id: int | None) -> Any:
    """The doctor's row (name, zone), None for no or an unknown doctor."""
    if doctor_id is None:
        return None
    async with site(request).db.connection() as conn:
        return (await repo.doctors_by_id(conn, [doctor_id])).get(doctor_id)


def _doctors_today(request: Request, doctor: Any) -> date:
    """Today in the doctor's zone: the agenda's day when none is asked for (an
    operator in Paris looking at a doctor in Tokyo sees the doctor's today)."""
    if doctor is None:
        return _today(request)
    try:
        tz = timezones.zone(doctor["timezone"])
    except ValueError:  # a zone stored before the rule: the agenda says so
        return _today(request)
    return site(request).clock.now().astimezone(tz).date()


@router.get("/clinic", response_class=HTMLResponse)
async def agenda(
    request: Request,
    session: SignedIn,
    doctor: Annotated[int | None, Query(ge=1, le=2**63 - 1)] = None,
    day_text: Annotated[DayText, Query(alias="day")] = None,
) -> HTMLResponse:
    """The form picks a doctor and a day (GET: the page can be bookmarked); the
    day defaults to today in the doctor's zone."""
    row = await _doctor(request, doctor)
    day, bad_day = parse_day(day_text, _doctors_today(request, row))
    seen = {"doctor": doctor, "doctor_row": row, "day": day}
    if bad_day is not None:
        return render(request, "clinic.html", session, 422, slots=[], error=bad_day, **seen)
    if doctor is None:
        return render(request, "clinic.html", session, slots=[], error=None, **seen)
    try:
        slots = await _appointments(request).agenda(doctor, day)
    except DomainError as err:
        return render_refused(request, "clinic.html", session, err, slots=[], **seen)
    return render(request, "clinic.html", session, slots=slots, error=None, **seen)


def _cancel_refused(request: Request, session: Session, err: DomainError) -> HTMLResponse:
    """The cancel page without an appointment: why it cannot be (or was not) cancelled."""
    return render_refused(
        request, "clinic_cancel.html", session, err, appt=None, back="/console/clinic"
    )


@router.get("/clinic/appointments/{id}/cancel", response_class=HTMLResponse)
async def confirm_cancel(
    request: Request,
    session: SignedIn,
    appointment_id: Annotated[int, Path(alias="id", ge=1, le=2**63 - 1)],
    day_text: Annotated[DayText, Query(alias="day")] = None,
) -> HTMLResponse:
    """Asks before cancelling: a page of its own, so it works without JavaScript.
    ``day`` is the agenda's (the doctor's local date) to come back to."""
    try:
        appt = await _appointments(request).get(appointment_id)
    except DomainError as err:
        return _cancel_refused(request, session, err)
    day, bad_day = parse_day(day_text, appt.start_at.date())
    if bad_day is not None:
        return _cancel_refused(request, session, validation_error(bad_day, at=("query", "day")))
    back = _agenda_url(appt.doctor_id, day)
    return render(request, "clinic_cancel.html", session, appt=appt, day=day, back=back, error=None)


@router.post("/clinic/appointments/{id}/cancel", response_model=None)
async def cancel(
    request: Request,
    session: Verified,
    appointment_id: Annotated[int, Path(alias="id", ge=1, le=2**63 - 1)],
) -> HTMLResponse | RedirectResponse:
    """The API's cancel with an admin's rights (any appointment); cancelling twice
    changes nothing, as there. Back to the agenda the admin came from (its day
    is checked first: a refused form changes nothing)."""
    raw_day = (await request.form()).get("day")
    day: date | None = None
    if isinstance(raw_day, str):
        day, bad_day = parse_day(raw_day, _today(request))
        if bad_day is not None:
            refused = validation_error(bad_day, at=("body", "day"))
            return _cancel_refused(request, session, refused)
    try:
        appt = await _appointments(request).cancel(appointment_id)
    except DomainError as err:
        return _cancel_refused(request, session, err)
    return RedirectResponse(_agenda_url(appt.doctor_id, day or appt.start_at.date()), 303)


@router.get("/clinic/slots/{id}/waitlist", response_class=HTMLResponse)
async def waitlist(
    request: Request,
    session: SignedIn,
    slot_id: Annotated[int, Path(alias="id", ge=1, le=2**63 - 1)],
) -> HTMLResponse:
    try:
        entries = await _appointments(request).waitlist(slot_id, WAITLIST_SHOWN)
    except DomainError as err:
        return render_refused(
            request,
            "clinic_waitlist.html",
            session,
            err,
            slot_id=slot_id,
            entries=[],
            shown=WAITLIST_SHOWN,
        )
    return render(
        request,
        "clinic_waitlist.html",
        session,
        slot_id=slot_id,
        entries=entries,
        shown=WAITLIST_SHOWN,
        error=None,
    )
