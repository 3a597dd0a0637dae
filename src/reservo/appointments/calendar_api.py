"""HTTP routes of the calendar feeds: making a link (bearer token, owner rules)
and serving a feed (no token: the URL is the secret)."""

from __future__ import annotations

from datetime import datetime
from email.utils import format_datetime, parsedate_to_datetime
from typing import Annotated

from fastapi import APIRouter, Path, Request
from fastapi.responses import JSONResponse, Response

from reservo.appointments.calendar import CalendarFeeds, Feed
from reservo.appointments.schemas import CalendarLinkOut
from reservo.core.http.auth import Principal
from reservo.core.http.callers import role_caller
from reservo.core.http.openapi import raises
from reservo.core.http.responses import json_response
from reservo.core.http.route_inputs import PathId, from_state

router = APIRouter(prefix="/api", tags=["appointments"])
# Outside /api: a calendar application fetches it without any token.
feeds_router = APIRouter(tags=["appointments"])

_feeds = from_state(CalendarFeeds, "calendar_feeds")
Patient = Annotated[Principal, role_caller("patient")]
Doctor = Annotated[Principal, role_caller("doctor")]

ICS = "text/calendar; charset=utf-8"


@router.post(
    "/patients/{patientId}/calendar-link",
    status_code=201,
    response_model=CalendarLinkOut,
    operation_id="createPatientCalendarLink",
    openapi_extra=raises(),
)
async def patient_calendar_link(
    patient_id: Annotated[PathId, Path(alias="patientId")], caller: Patient, request: Request
) -> JSONResponse:
    """A secret URL of the patient's calendar feed (their appointments); the
    previous URL stops working. The owner patient or an admin. No
    Idempotency-Key: its replay would have to store the URL, and only the
    URL's hash is ever stored; a retry simply makes a newer link."""
    caller.require_owner("patient", patient_id)
    url = await _feeds(request).new_link("patient", patient_id)
    return json_response(201, CalendarLinkOut(url=url).wire())


@router.post(
    "/doctors/{doctorId}/calendar-link",
    status_code=201,
    response_model=CalendarLinkOut,
    operation_id="createDoctorCalendarLink",
    openapi_extra=raises("doctor_not_found"),
)
async def doctor_calendar_link(
    doctor_id: Annotated[PathId, Path(alias="doctorId")], caller: Doctor, request: Request
) -> JSONResponse:
    """A secret URL of the doctor's agenda as a calendar feed; the previous URL
    stops working. The doctor themself or an admin."""
    caller.require_owner("doctor", doctor_id)
    url = await _feeds(request).new_link("doctor", doctor_id)
    return json_response(201, CalendarLinkOut(url=url).wire())


_FEED_DOC = {
    "content": {"text/calendar": {"schema": {"type": "string"}}},
    "description": "The feed (RFC 5545): one VEVENT per appointment, UIDs stable across "
    "reschedules, instants in UTC",
}


@feeds_router.get(
    "/calendars/{token}.ics",
    response_class=Response,
    operation_id="getCalendarFeed",
    responses={200: _FEED_DOC, 304: {"description": "Not modified (ETag or date)"}},
    openapi_extra=raises("calendar_not_found"),
)
async def calendar_feed(token: str, request: Request) -> Response:
    """The calendar feed behind a link (whoever holds the URL): BOOKED
    appointments from 30 days ago on, cancelled ones as STATUS:CANCELLED for 30
    days. Served from a cache every change drops; ETag and Last-Modified let a
    client poll with a conditional request (304). HEAD works too."""
    feed = await _feeds(request).feed(token)
    return _answer(feed, request, with_body=True)


@feeds_router.head("/calendars/{token}.ics", include_in_schema=False)
async def calendar_feed_head(token: str, request: Request) -> Response:
    feed = await _feeds(request).feed(token)
    return _answer(feed, request, with_body=False)


def _answer(feed: Feed, request: Request, *, with_body: bool) -> Response:
    cache_life = _feeds(request).limits.cache_life_s
    headers = {
        "ETag": feed.etag,
        "Last-Modified": format_datetime(feed.last_modified, usegmt=True),
        # Private: the URL is a secret, no shared cache should keep the feed.
        "Cache-Control": f"private, max-age={cache_life}",
        # The URL must not leak through a Referer or a search engine.
        "Referrer-Policy": "no-referrer",
        "X-Robots-Tag": "noindex, nofollow",
    }
    if _not_modified(feed, request):
        return Response(status_code=304, headers=headers)
    headers["Content-Length"] = str(len(feed.body))
    return Response(feed.body if with_body else b"", media_type=ICS, headers=headers)


def _not_modified(feed: Feed, request: Request) -> bool:
    """RFC 9110 13.2.2: If-None-Match (weak comparison) decides when sent;
    If-Modified-Since only without it."""
    match = request.headers.get("if-none-match")
    if match is not None:
        tags = {t.strip().removeprefix("W/") for t in match.split(",")}
        return "*" in tags or feed.etag in tags
    since = request.headers.get("if-modified-since")
    if since is None:
        return False
    try:
        at: datetime = parsedate_to_datetime(since)
    except (TypeError, ValueError):
        return False  # an unreadable date is ignored, as the RFC says
    if at.tzinfo is None:
        return False
    return feed.last_modified <= at
