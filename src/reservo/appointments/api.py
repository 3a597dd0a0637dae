"""HTTP routes of the Appointments API: parse, authorize, call the service, render."""

from __future__ import annotations

from collections.abc import Callable
from datetime import datetime
from typing import Annotated, Any

from fastapi import APIRouter, Path, Query, Request
from fastapi.responses import JSONResponse, Response

from reservo.appointments import domain
from reservo.appointments.domain import Appointment, ScheduleRule
from reservo.appointments.gate import BOOK_ENDPOINT, GateRefusal, request_key
from reservo.appointments.schemas import (
    Agenda,
    AgendaAppointment,
    AgendaSlot,
    AppointmentIn,
    AppointmentOut,
    AppointmentPage,
    AppointmentRescheduleIn,
    ContactIn,
    ContactOut,
    DoctorIn,
    Price,
    PushKeys,
    PushSubscriptionOut,
    RepeatingScheduleOut,
    RescheduledOut,
    ScheduleIn,
    ScheduleOut,
    SeriesIn,
    SeriesOut,
    SlotOut,
    Status,
    WaitlistIn,
    WaitlistOut,
)
from reservo.appointments.schemas import Doctor as DoctorOut
from reservo.appointments.service import AppointmentService
from reservo.core.http.auth import Principal
from reservo.core.http.callers import AdminCaller, Caller, role_caller
from reservo.core.http.idempotency import IdempotencyStore, Within, validate_key
from reservo.core.http.idempotent import (
    IdempotencyKey,
    RequiredIdempotencyKey,
    idempotency_store,
    required_key,
    run_idempotent,
    run_idempotent_route,
)
from reservo.core.http.openapi import raises
from reservo.core.http.pagination import (
    DEFAULT_LIMIT,
    After,
    Limit,
    decode_cursor,
    malformed_cursor,
    page,
)
from reservo.core.http.responses import json_bytes, json_response, model_from
from reservo.core.http.route_inputs import PathId, from_state
from reservo.core.http.schemas import Day
from reservo.core.kernel.errors import DomainError

router = APIRouter(prefix="/api", tags=["appointments"])


_svc = from_state(AppointmentService, "appointments")
# Who may use which route, checked before the request is parsed (core.http.callers.Roles).
Patient = Annotated[Principal, role_caller("patient")]
Doctor = Annotated[Principal, role_caller("doctor")]
# Booking: patients for themselves; the slot's doctor only to overbook.
PatientOrDoctor = Annotated[Principal, role_caller("patient", "doctor")]
DoctorId = Annotated[PathId, Path(alias="doctorId")]
PatientId = Annotated[PathId, Path(alias="patientId")]


def render(appt: Appointment, payment_url: str | None = None) -> dict[str, Any]:
    # The wire fields are the appointment's own, by name (doctor_id stays inside).
    # An appointment booked at once answers as before: without the prepaid fields.
    out = AppointmentOut.model_validate(appt, from_attributes=True)
    if appt.price_amount is None or appt.price_currency is None:
        return out.model_dump(mode="json", by_alias=True, exclude=_PREPAID_FIELDS)
    price = Price(amount=appt.price_amount, currency=appt.price_currency)
    return out.model_copy(update={"price": price, "payment_url": payment_url}).wire()


_PREPAID_FIELDS = {"price", "hold_expires_at", "payment_url", "overpaid_refund"}


def renderer(svc: AppointmentService) -> Callable[[Appointment], dict[str, Any]]:
    """``render`` with the paymentUrl of a HELD appointment (the gateway's page):
    only ever used in answers to its patient or an admin."""
    return lambda appt: render(appt, svc.payment_url(appt))


@router.post(
    "/doctors",
    status_code=201,
    response_model=DoctorOut,
    operation_id="createDoctor",
    openapi_extra=raises(),
)
async def create_doctor(body: DoctorIn, caller: AdminCaller, request: Request) -> JSONResponse:
    """Creates a doctor (admin): their `timezone` is the one their schedules'
    local times are read in."""
    doctor = await _svc(request).create_doctor(body.name, body.timezone, body.specialty)
    out = DoctorOut(
        id=doctor.id, name=doctor.name, timezone=doctor.timezone, specialty=doctor.specialty
    )
    return json_response(201, out.wire())


@router.post(
    "/doctors/{doctorId}/schedules",
    status_code=201,
    response_model=ScheduleOut | RepeatingScheduleOut,
    operation_id="createSchedule",
    openapi_extra=raises("doctor_not_found", "unknown_timezone"),
)
async def create_schedule(
    doctor_id: DoctorId,
    body: ScheduleIn,
    caller: Doctor,
    request: Request,
) -> JSONResponse:
    """Slots of the doctor's local working hours. Without `to` the schedule repeats:
    its slots are generated now up to the booking horizon and kept generated, day
    after day, by the `appointments` worker role. A slot that exists or overlaps
    another slot of the doctor is skipped (counted in `skipped`)."""
    caller.require_owner("doctor", doctor_id)
    rule = ScheduleRule(
        body.from_,
        body.to or body.from_,
        frozenset(body.weekdays),
        body.start_time,
        body.end_time,
        body.slot_minutes,
        body.capacity,
        body.overbook_limit,
        None
        if body.prepaid is None
        else domain.Prepaid(body.prepaid.amount, body.prepaid.currency, body.prepaid.hold_minutes),
        domain.BookingRules(body.min_notice_minutes, body.max_per_patient_per_day),
    )
    if body.to is None:
        schedule_id, created, skipped = await _svc(request).create_repeating_schedule(
            doctor_id, rule
        )
        out = RepeatingScheduleOut(created=created, skipped=skipped, schedule_id=schedule_id)
        return json_response(201, out.wire())
    created, skipped = await _svc(request).create_schedule(doctor_id, rule)
    return json_response(201, ScheduleOut(created=created, skipped=skipped).wire())


@router.get(
    "/doctors/{doctorId}/slots",
    response_model=list[SlotOut],
    operation_id="listDoctorSlots",
    openapi_extra=raises("doctor_not_found", "unknown_timezone"),
)
async def list_slots(
    doctor_id: DoctorId,
    day: Annotated[Day, Query(alias="date")],
    caller: Caller,
    request: Request,
) -> Response:
    """The doctor's slots on `date` (their local day) that have not started and
    still have room, oldest first. May lag a booking by the slot cache's
    lifetime: booking a slot that just filled answers `slot_full`."""
    return json_bytes(200, await _svc(request).list_slots(doctor_id, day))


@router.post(
    "/appointments",
    status_code=201,
    response_model=AppointmentOut,
    operation_id="bookAppointment",
    openapi_extra=raises(
        "slot_not_found",
        "slot_full",
        "already_booked",
        "patient_busy",
        "slot_in_past",
        "slot_not_open",
        "rate_limited",
        "overbook_limit",
        "no_show_limit",
        "too_late_to_book",
        "daily_limit",
    ),
)
async def book(
    body: AppointmentIn,
    caller: PatientOrDoctor,
    request: Request,
    idempotency_key: RequiredIdempotencyKey = None,
) -> JSONResponse:
    """A patient books a seat for themself (Idempotency-Key required). With
    `"overbook": true` the slot's doctor or an admin books a patient beyond the
    slot's capacity, up to its `overbookLimit` (409 `overbook_limit` when none is
    left); such a booking always takes an overbooked seat. Patients get 403.
    A slot of a prepaid schedule is held, not booked: 201 with `status: "HELD"`,
    `holdExpiresAt` and `paymentUrl`; the held seat counts against capacity until
    the payment webhook makes it BOOKED or the hold ends (EXPIRED, seat freed).
    A schedule's booking rules: a patient books no later than its
    `minNoticeMinutes` before the slot's start (409 `too_late_to_book`; an
    admin booking for them is not bound), and holds at most its
    `maxPerPatientPerDay` appointments with the doctor per local day (409
    `daily_limit`)."""
    if body.overbook:
        return await overbook_flow(
            _svc(request),
            idempotency_store(request),
            caller,
            body,
            idempotency_key,
            await request.body(),
        )
    return await book_flow(
        _svc(request),
        idempotency_store(request),
        caller,
        body.slot_id,
        body.patient_id,
        idempotency_key,
        await request.body(),
    )


async def book_flow(
    svc: AppointmentService,
    store: IdempotencyStore,
    caller: Principal,
    slot_id: int,
    patient_id: int,
    idempotency_key: str | None,
    raw: bytes,
) -> JSONResponse:
    """A patient's booking (or an admin's for them), once the request is parsed."""
    caller.require_owner("patient", patient_id)
    key = required_key(idempotency_key)
    scoped_key = request_key(caller.key_owner, key)

    async def book_once(within: Within[Appointment] | None) -> Appointment:
        await svc.remember_key(scoped_key)
        return await svc.book(slot_id, patient_id, within, notice=not caller.is_admin)

    try:
        await svc.admit(patient_id, slot_id, scoped_key)
        async with svc.turn(slot_id, scoped_key):
            return await run_idempotent(
                store, caller, BOOK_ENDPOINT, key, raw, book_once, renderer(svc)
            )
    except GateRefusal as err:
        # Redis may have forgotten that this key reached the database (its
        # mark expired, Redis lost its state): a finished request's replay
        # still gets its stored answer, never a refusal of the gate (the
        # refusal says when the attempt cannot be one).
        if not err.may_be_replay:
            raise
        done = await store.finished(caller.key_owner, BOOK_ENDPOINT, key, raw)
        if done is None:
            raise
        return json_response(done.status, done.body)


async def overbook_flow(
    svc: AppointmentService,
    store: IdempotencyStore,
    caller: Principal,
    body: AppointmentIn,
    idempotency_key: str | None,
    raw: bytes,
) -> JSONResponse:
    """A staff booking beyond capacity: the route's role rule lets patients in
    (they book for themselves), so this check is the only way to an overbooked
    seat."""
    if not caller.is_admin and caller.role != "doctor":
        raise DomainError("forbidden", "only the slot's doctor or an admin may overbook")
    key = required_key(idempotency_key)
    doctor = None if caller.is_admin else caller.sub

    async def overbook_once(within: Within[Appointment] | None) -> Appointment:
        return await svc.overbook(body.slot_id, body.patient_id, doctor, within)

    endpoint = BOOK_ENDPOINT
    return await run_idempotent(store, caller, endpoint, key, raw, overbook_once, render)


# The two hottest routes, served on the fast path (core/http/hotroute.py).
HOT_ROUTES = (list_slots, book)


async def _owned(request: Request, caller: Principal, appointment_id: int) -> Appointment:
    """The appointment, if it is the caller's; anyone else's is 404 as one that
    does not exist (a 403 would tell which ids exist)."""
    appt = await _svc(request).get(appointment_id)
    if not caller.owns("patient", appt.patient_id):
        raise DomainError("appointment_not_found", f"no appointment {appointment_id}")
    return appt


@router.get(
    "/appointments/{appointmentId}",
    response_model=AppointmentOut,
    operation_id="getAppointment",
    openapi_extra=raises("appointment_not_found"),
)
async def get_appointment(
    appointment_id: Annotated[PathId, Path(alias="appointmentId")],
    caller: Patient,
    request: Request,
) -> JSONResponse:
    """One appointment, to its patient or an admin; anybody else's is
    `appointment_not_found`, as if it did not exist."""
    appt = await _owned(request, caller, appointment_id)
    return json_response(200, renderer(_svc(request))(appt))


@router.delete(
    "/appointments/{appointmentId}",
    response_model=AppointmentOut,
    operation_id="cancelAppointment",
    openapi_extra=raises("appointment_not_found", "slot_in_past", "not_held"),
)
async def cancel(
    appointment_id: Annotated[PathId, Path(alias="appointmentId")],
    caller: Patient,
    request: Request,
) -> JSONResponse:
    """Cancels a BOOKED appointment, or a HELD one (a prepaid slot's seat not
    paid yet): its seat is freed. Cancelling twice is 200 both times; an EXPIRED
    one (its hold ended unpaid) is 409 `not_held`. The patient or an admin;
    anybody else's is `appointment_not_found`, as if it did not exist (a 403
    would tell which ids exist)."""
    await _owned(request, caller, appointment_id)
    return json_response(200, render(await _svc(request).cancel(appointment_id)))


# -- second release ---------------------------------------------------------------------
# New routes only below this line: the booking and slot-list routes above are the
# hot path and are tuned on their own.


def _position(cursor: str | None) -> tuple[datetime, int] | None:
    """The (start, id) a patient-list cursor carries; 422 when it is not one."""
    if cursor is None:
        return None
    start, appointment_id = decode_cursor(cursor, str, int)
    try:
        at = datetime.fromisoformat(start)
    except ValueError:
        at = None
    if at is None or at.tzinfo is None:
        raise malformed_cursor()
    return at, appointment_id


@router.get(
    "/patients/{patientId}/appointments",
    response_model=AppointmentPage,
    operation_id="listPatientAppointments",
    openapi_extra=raises(),
)
async def list_patient_appointments(
    patient_id: PatientId,
    caller: Patient,
    request: Request,
    status: Annotated[Status | None, Query()] = None,
    limit: Limit = DEFAULT_LIMIT,
    after: After = None,
) -> JSONResponse:
    """A patient's appointments, soonest first (keyset pages: `next` is the cursor
    of the next page, null on the last). The owner patient or an admin."""
    caller.require_owner("patient", patient_id)
    appts = await _svc(request).patient_appointments(
        patient_id, status, _position(after), limit + 1
    )
    items, nxt = page(appts, limit, lambda a: (a.start_at.isoformat(), a.id))
    show = renderer(_svc(request))
    return json_response(200, {"items": [show(a) for a in items], "next": nxt})


def _agenda_slot(s: domain.AgendaSlot) -> AgendaSlot:
    appointments = [
        AgendaAppointment.model_validate(a, from_attributes=True) for a in s.appointments
    ]
    return model_from(
        AgendaSlot, s, available=s.capacity - s.booked_count, appointments=appointments
    )


@router.get(
    "/doctors/{doctorId}/agenda",
    response_model=Agenda,
    operation_id="getDoctorAgenda",
    openapi_extra=raises("doctor_not_found", "unknown_timezone"),
)
async def doctor_agenda(
    doctor_id: Annotated[PathId, Path(alias="doctorId")],
    day: Annotated[Day, Query(alias="date")],
    caller: Doctor,
    request: Request,
) -> JSONResponse:
    """Every slot of the doctor's local date (full, past or not open yet), each with
    its appointments, cancelled ones included. The doctor themself or an admin."""
    caller.require_owner("doctor", doctor_id)
    slots = await _svc(request).agenda(doctor_id, day)
    out = Agenda(doctor_id=doctor_id, date=day, slots=[_agenda_slot(s) for s in slots])
    return json_response(200, out.wire())


def rescheduled_renderer(svc: AppointmentService) -> Callable[[Appointment], dict[str, Any]]:
    """The moved appointment; moved into a prepaid slot it is HELD, with its paymentUrl."""
    return lambda appt: {
        **render(appt, svc.payment_url(appt)),
        "rescheduledFrom": appt.rescheduled_from,
    }


@router.post(
    "/appointments/{appointmentId}/reschedule",
    status_code=200,
    response_model=RescheduledOut,
    operation_id="rescheduleAppointment",
    openapi_extra=raises(
        "appointment_not_found",
        "not_reschedulable",
        "slot_not_found",
        "slot_full",
        "already_booked",
        "patient_busy",
        "slot_in_past",
        "slot_not_open",
        "no_show_limit",
        "contention",
        "too_late_to_book",
        "daily_limit",
    ),
)
async def reschedule(
    appointment_id: Annotated[PathId, Path(alias="appointmentId")],
    body: AppointmentRescheduleIn,
    caller: Patient,
    request: Request,
    idempotency_key: RequiredIdempotencyKey = None,
) -> JSONResponse:
    """Move a BOOKED appointment to another slot: the new appointment is booked and
    the old one cancelled in one transaction (both or neither), and the old seat
    goes to that slot's waitlist. Idempotency-Key required. Moved into a slot of a
    prepaid schedule, the new appointment is HELD until paid (as a booking there).
    The new slot's booking rules apply as to a booking (409 `too_late_to_book`
    for a patient, `daily_limit` counting the day without the old appointment).
    The patient or an admin; anybody else's appointment is
    `appointment_not_found`, as if it did not exist (a 403 would tell which ids
    exist)."""
    key = required_key(idempotency_key)
    old = await _owned(request, caller, appointment_id)
    svc = _svc(request)
    endpoint = f"POST /api/appointments/{appointment_id}/reschedule"

    async def move_once(within: Within[Appointment] | None) -> Appointment:
        return await svc.reschedule(old, body.slot_id, within, notice=not caller.is_admin)

    return await run_idempotent_route(
        request, caller, endpoint, key, move_once, rescheduled_renderer(svc), status=200
    )


@router.post(
    "/slots/{slotId}/waitlist",
    status_code=201,
    response_model=WaitlistOut,
    operation_id="joinWaitlist",
    openapi_extra=raises(
        "slot_not_found",
        "slot_available",
        "already_waiting",
        "already_booked",
        "slot_in_past",
        "slot_not_open",
        "no_show_limit",
    ),
)
async def join_waitlist(
    slot_id: Annotated[PathId, Path(alias="slotId")],
    body: WaitlistIn,
    caller: Patient,
    request: Request,
    idempotency_key: IdempotencyKey = None,
) -> JSONResponse:
    """Wait for a seat of a full slot. When a seat frees (a cancel, a reschedule
    away), the first waiting patient still free then is booked in the same
    transaction and notified; a patient busy by then is skipped and told. 409
    `slot_available` while the slot has room (book it instead). Idempotency-Key
    optional: a retry with it replays the answer (200); without it, joining twice
    is 409 `already_waiting`."""
    caller.require_owner("patient", body.patient_id)
    key = validate_key(idempotency_key, required=False)
    svc = _svc(request)

    async def join_once(within: Within[domain.Waiting] | None) -> domain.Waiting:
        return await svc.join_waitlist(slot_id, body.patient_id, within)

    def render_waiting(w: domain.Waiting) -> dict[str, Any]:
        return WaitlistOut(slot_id=w.slot_id, patient_id=w.patient_id, position=w.position).wire()

    endpoint = f"POST /api/slots/{slot_id}/waitlist"
    return await run_idempotent_route(request, caller, endpoint, key, join_once, render_waiting)


@router.delete(
    "/slots/{slotId}/waitlist/{patientId}",
    status_code=204,
    response_class=Response,
    operation_id="leaveWaitlist",
    openapi_extra=raises("slot_not_found", "not_waiting"),
)
async def leave_waitlist(
    slot_id: Annotated[PathId, Path(alias="slotId")],
    patient_id: PatientId,
    caller: Patient,
    request: Request,
) -> Response:
    """Leave a slot's waitlist. 404 `not_waiting` when not on it."""
    caller.require_owner("patient", patient_id)
    await _svc(request).leave_waitlist(slot_id, patient_id)
    return Response(status_code=204)


@router.put(
    "/patients/{patientId}/contact",
    response_model=ContactOut,
    operation_id="setPatientContact",
    openapi_extra=raises("destination_not_allowed"),
)
async def put_contact(
    patient_id: PatientId,
    body: ContactIn,
    caller: Patient,
    request: Request,
) -> JSONResponse:
    """Where the patient's notifications go: e-mail through the SMTP channel, phone
    through the SMS/HTTP channel, and Web Push to each browser subscription (at
    most 5); every notification goes to every channel they have. All are
    replaced; an omitted one is cleared. 422 `destination_not_allowed` for a push
    endpoint the egress rules refuse."""
    caller.require_owner("patient", patient_id)
    c = await _svc(request).set_contact(
        patient_id, body.email, body.phone, [s.value() for s in body.push_subscriptions]
    )
    out = ContactOut(
        patient_id=c.user_id,
        email=c.email,
        phone=c.phone,
        push_subscriptions=[
            PushSubscriptionOut(endpoint=s.endpoint, keys=PushKeys(p256dh=s.p256dh, auth=s.auth))
            for s in c.push
        ],
    )
    return json_response(200, out.wire())


# -- third release ----------------------------------------------------------------------


@router.post(
    "/appointments/{appointmentId}/no-show",
    response_model=AppointmentOut,
    operation_id="markNoShow",
    openapi_extra=raises("appointment_not_found", "not_started", "not_booked"),
)
async def mark_no_show(
    appointment_id: Annotated[PathId, Path(alias="appointmentId")],
    caller: Doctor,
    request: Request,
) -> JSONResponse:
    """The patient did not come: BOOKED -> NO_SHOW, after the slot's start (409
    `not_started` before, `not_booked` when not BOOKED). The slot's doctor or an
    admin; another doctor's appointment is 404. A patient with too many no-shows
    is blocked from booking (409 `no_show_limit`) for a while."""
    doctor = None if caller.is_admin else caller.sub
    appt = await _svc(request).mark_no_show(appointment_id, doctor)
    return json_response(200, render(appt))


@router.delete(
    "/patients/{patientId}/no-shows",
    status_code=204,
    response_class=Response,
    operation_id="clearNoShows",
    openapi_extra=raises(),
)
async def clear_no_shows(patient_id: PatientId, caller: AdminCaller, request: Request) -> Response:
    """An admin lifts the patient's no-show block; the no-shows so far stop
    counting towards the next one."""
    await _svc(request).clear_no_shows(patient_id)
    return Response(status_code=204)


# -- fourth release: series ---------------------------------------------------------------


def render_series(svc: AppointmentService) -> Callable[[domain.Series], dict[str, Any]]:
    show = renderer(svc)
    return lambda series: {
        "seriesId": series.id,
        "appointments": [show(a) for a in series.appointments],
    }


@router.post(
    "/appointment-series",
    status_code=201,
    response_model=SeriesOut,
    operation_id="bookAppointmentSeries",
    openapi_extra=raises(
        "slot_not_found",
        "slot_full",
        "already_booked",
        "patient_busy",
        "slot_in_past",
        "slot_not_open",
        "no_show_limit",
        "too_late_to_book",
        "daily_limit",
        "contention",
    ),
)
async def book_series(
    body: SeriesIn,
    caller: Patient,
    request: Request,
    idempotency_key: RequiredIdempotencyKey = None,
) -> JSONResponse:
    """Book several slots for one patient, all or nothing (Idempotency-Key
    required): each slot is booked as `POST /api/appointments` would (a prepaid
    slot is HELD), in one transaction. When any slot is refused, nothing is
    booked and the answer is 409 with the first refusal's `code` and its
    `slotId`. The owner patient or an admin (who is not bound by the minimum
    notice)."""
    caller.require_owner("patient", body.patient_id)
    key = required_key(idempotency_key)
    svc = _svc(request)

    async def book_once(within: Within[domain.Series] | None) -> domain.Series:
        return await svc.book_series(
            body.patient_id, body.slot_ids, within, notice=not caller.is_admin
        )

    return await run_idempotent_route(
        request, caller, "POST /api/appointment-series", key, book_once, render_series(svc)
    )


@router.delete(
    "/appointment-series/{seriesId}",
    response_model=SeriesOut,
    operation_id="cancelAppointmentSeries",
    openapi_extra=raises("series_not_found"),
)
async def cancel_series(
    series_id: Annotated[PathId, Path(alias="seriesId")],
    caller: Patient,
    request: Request,
) -> JSONResponse:
    """Cancel the rest of a series: its appointments that have not started (each
    as `DELETE /api/appointments/{id}`, its seat to the slot's waitlist). Those
    started, cancelled or expired stay as they are; cancelling twice is 200 both
    times. Answers the whole series. The owner patient or an admin; anyone
    else's series is 404 `series_not_found`."""
    svc = _svc(request)
    if not caller.owns("patient", await svc.series_patient(series_id)):
        raise DomainError("series_not_found", f"no series {series_id}")
    return json_response(200, render_series(svc)(await svc.cancel_series(series_id)))
