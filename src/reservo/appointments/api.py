"""HTTP routes of the Appointments API: parse, authorize, call the service, render."""

from __future__ import annotations

import re
from datetime import date
from typing import Annotated, Any

from fastapi import APIRouter, Path, Query, Request
from fastapi.responses import JSONResponse
from starlette.responses import Response

from reservo.appointments.domain import Appointment, ScheduleRule
from reservo.appointments.schemas import (
    AppointmentIn,
    AppointmentOut,
    Doctor,
    DoctorIn,
    ScheduleIn,
    ScheduleOut,
    SlotOut,
)
from reservo.appointments.service import AppointmentService
from reservo.core.auth import Principal
from reservo.core.errors import DomainError
from reservo.core.http import (
    Caller,
    IdempotencyKey,
    idempotency_store,
    json_response,
    problem_responses,
    required_key,
    run_idempotent,
)
from reservo.core.idempotency import IdempotencyStore, Within
from reservo.core.lean import LeanRequest, LeanRoute, json_bytes
from reservo.core.schemas import EARLIEST_DAY, LATEST_DAY

router = APIRouter(prefix="/api", tags=["appointments"])
PathId = Annotated[int, Path(ge=1, le=2**63 - 1)]
PROBLEMS = problem_responses(400, 401, 403, 404, 409, 422, 429, 503)


def _svc(request: Request) -> AppointmentService:
    svc: AppointmentService = request.app.state.appointments
    return svc


def render(appt: Appointment) -> dict[str, Any]:
    return AppointmentOut(
        id=appt.id,
        slot_id=appt.slot_id,
        patient_id=appt.patient_id,
        status=appt.status,  # type: ignore[arg-type]
        start_at=appt.start_at,
        end_at=appt.end_at,
        created_at=appt.created_at,
    ).wire()


@router.post("/doctors", status_code=201, response_model=Doctor, responses=PROBLEMS)
async def create_doctor(body: DoctorIn, caller: Caller, request: Request) -> JSONResponse:
    caller.require("admin")
    doctor = await _svc(request).create_doctor(body.name, body.timezone, body.specialty)
    return json_response(201, Doctor(**doctor).wire())


@router.post(
    "/doctors/{doctorId}/schedules", status_code=201, response_model=ScheduleOut, responses=PROBLEMS
)
async def create_schedule(
    doctor_id: Annotated[PathId, Path(alias="doctorId")],
    body: ScheduleIn,
    caller: Caller,
    request: Request,
) -> JSONResponse:
    caller.require_owner("doctor", doctor_id)
    rule = ScheduleRule(
        body.from_,
        body.to,
        frozenset(body.weekdays),
        body.start_time,
        body.end_time,
        body.slot_minutes,
        body.capacity,
    )
    created, skipped = await _svc(request).create_schedule(doctor_id, rule)
    return json_response(201, ScheduleOut(created=created, skipped=skipped).wire())


@router.get("/doctors/{doctorId}/slots", response_model=list[SlotOut], responses=PROBLEMS)
async def list_slots(
    doctor_id: Annotated[PathId, Path(alias="doctorId")],
    day: Annotated[date, Query(alias="date", ge=EARLIEST_DAY, le=LATEST_DAY)],
    caller: Caller,
    request: Request,
) -> Response:
    return json_bytes(200, await _svc(request).list_slots(doctor_id, day))


@router.post("/appointments", status_code=201, response_model=AppointmentOut, responses=PROBLEMS)
async def book(
    body: AppointmentIn, caller: Caller, request: Request, idempotency_key: IdempotencyKey = None
) -> JSONResponse:
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
    """What POST /api/appointments does once the request is parsed (the FastAPI
    route and the lean path both run this)."""
    caller.require_owner("patient", patient_id)
    key = required_key(idempotency_key)
    endpoint = "POST /api/appointments"
    scoped_key = f"{caller.role}:{caller.sub}:{endpoint}:{key}"
    if await svc.gate(patient_id, slot_id, scoped_key):
        # Refused by the Redis filter before it ran: nothing was created and nothing is
        # recorded, so a retry with this key is simply evaluated again.
        raise DomainError("slot_full", "this slot has no capacity left")

    async def book_once(within: Within[Appointment] | None) -> Appointment:
        await svc.remember_key(scoped_key)
        return await svc.book(slot_id, patient_id, within)

    return await run_idempotent(store, caller, endpoint, key, raw, book_once, render)


# --- the lean path (reservo.core.lean): the two hottest routes without FastAPI's
# per-request work. Anything not in the common shape goes to the routes above.

_DAY_QUERY = re.compile(rb"date=([0-9]{4}-[0-9]{2}-[0-9]{2})", re.ASCII)
_BOOK_KEYS = frozenset(("slotId", "patientId"))


def _id(value: Any) -> int | None:
    # StrictInt: no bool, no float, no string; within [1, 2^63-1].
    if type(value) is int and 1 <= value <= 2**63 - 1:
        return value
    return None


async def lean_list_slots(req: LeanRequest) -> Response | None:
    m = _DAY_QUERY.fullmatch(req.scope["query_string"])
    doctor_id = req.id_param("doctorId")
    if m is None or doctor_id is None:
        return None
    try:
        day = date.fromisoformat(m[1].decode())
    except ValueError:
        return None
    if not EARLIEST_DAY <= day <= LATEST_DAY or req.principal() is None:
        return None
    svc: AppointmentService = req.app_state.appointments
    return json_bytes(200, await svc.list_slots(doctor_id, day))


async def lean_book(req: LeanRequest) -> Response | None:
    caller = req.principal()
    body = req.json_body()
    if caller is None or type(body) is not dict or body.keys() != _BOOK_KEYS:
        return None
    slot_id, patient_id = _id(body["slotId"]), _id(body["patientId"])
    if slot_id is None or patient_id is None:
        return None
    state = req.app_state
    return await book_flow(
        state.appointments,
        state.idempotency,
        caller,
        slot_id,
        patient_id,
        req.header(b"idempotency-key"),
        req.body,
    )


LEAN_ROUTES = (
    LeanRoute("GET", "/api/doctors/{doctorId}/slots", lean_list_slots),
    LeanRoute("POST", "/api/appointments", lean_book),
)


async def _owned(request: Request, caller: Caller, appointment_id: int) -> Appointment:
    caller.require("patient")
    appt = await _svc(request).get(appointment_id)
    caller.require_owner("patient", appt.patient_id)
    return appt


@router.get("/appointments/{id}", response_model=AppointmentOut, responses=PROBLEMS)
async def get_appointment(
    appointment_id: Annotated[PathId, Path(alias="id")], caller: Caller, request: Request
) -> JSONResponse:
    return json_response(200, render(await _owned(request, caller, appointment_id)))


@router.delete("/appointments/{id}", response_model=AppointmentOut, responses=PROBLEMS)
async def cancel(
    appointment_id: Annotated[PathId, Path(alias="id")], caller: Caller, request: Request
) -> JSONResponse:
    await _owned(request, caller, appointment_id)
    return json_response(200, render(await _svc(request).cancel(appointment_id)))
