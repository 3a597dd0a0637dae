"""The rentals pages: a car's calendar drawn as a timeline (holds, confirmed
trips and the turnaround buffers after them, each labelled in words) and a
customer's bookings of one status, a keyset page at a time. Both read through
the rentals service, the same use cases as ``GET /api/cars/{id}/calendar`` and
``GET /api/customers/{id}/bookings``."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import UTC, datetime, time, timedelta
from typing import Annotated, Any, get_args

from fastapi import APIRouter, Query, Request
from fastapi.responses import HTMLResponse

from reservo.console.web import SignedIn, parse_day, render, render_refused, site
from reservo.core.http.pagination import page, time_cursor, time_key
from reservo.core.http.schemas import LATEST
from reservo.core.kernel.errors import DomainError
from reservo.rentals import BlockedPeriod, Booking, BookingStatus, RentalService

router = APIRouter(prefix="/console", include_in_schema=False)
PAGE = 25
WIDTH = 1000  # the timeline's viewBox width; the SVG scales to the screen
ROW_H = 34
TOP = 22  # room for the day ticks
Id = Annotated[int | None, Query(ge=1, le=2**63 - 1)]
STATUSES: tuple[str, ...] = get_args(BookingStatus)


def _rentals(request: Request) -> RentalService:
    s: RentalService = request.app.state.rentals
    return s


@dataclass(frozen=True)
class Bar:
    """One drawn part of a booking: its trip or its buffer, in viewBox units."""

    x: float
    y: float
    width: float
    kind: str  # HOLD | CONFIRMED | ON_TRIP | buffer
    short: str  # drawn on the bar
    label: str  # its tooltip


def timeline(periods: list[BlockedPeriod], start: datetime, end: datetime) -> list[Bar]:
    """A row per booking: the trip, then its buffer, clipped to [start, end)."""
    span = (end - start).total_seconds()

    def x(t: datetime) -> float:
        return round(max(0.0, min(1.0, (t - start).total_seconds() / span)) * WIDTH, 1)

    bars: list[Bar] = []
    for row, p in enumerate(periods):
        y = TOP + row * ROW_H
        short = f"{p.status} #{p.booking_id}"
        trip = f"{short} {p.from_at:%m-%d %H:%M} to {p.return_at:%m-%d %H:%M}"
        left, right = x(p.from_at), x(p.return_at)
        bars.append(Bar(left, y, right - left, p.status, short, trip))
        if p.buffer_until > p.return_at:
            bars.append(
                Bar(
                    x(p.return_at),
                    y,
                    x(p.buffer_until) - x(p.return_at),
                    "buffer",
                    "buffer",
                    f"buffer of #{p.booking_id} until {p.buffer_until:%m-%d %H:%M}",
                )
            )
    return bars


@router.get("/rentals", response_class=HTMLResponse)
async def car_calendar(
    request: Request,
    session: SignedIn,
    car: Id = None,
    day_text: Annotated[str | None, Query(alias="day", max_length=100)] = None,
    days: Annotated[int, Query(ge=1, le=31)] = 7,
) -> HTMLResponse:
    """The car's calendar from ``day`` (UTC) for ``days`` days."""
    day, bad_day = parse_day(day_text, site(request).clock.now().date())
    if bad_day is None and day + timedelta(days=days) > LATEST.date():
        bad_day = f"{days} days from {day.isoformat()} end after the last accepted day."
    if bad_day is not None:
        day = site(request).clock.now().date()
    start = datetime.combine(day, time(), UTC)
    end = start + timedelta(days=days)
    ticks = [
        (round(i / days * WIDTH, 1), (day + timedelta(days=i)).strftime("%m-%d"))
        for i in range(days)
    ]
    context: dict[str, Any] = {
        "car": car,
        "day": day,
        "days": days,
        "periods": [],
        "bars": [],
        "ticks": ticks,
        "width": WIDTH,
        "height": TOP + ROW_H,
        "row_h": ROW_H,
        "car_row": None,
    }
    if bad_day is not None:
        return render(request, "rentals.html", session, 422, error=bad_day, **context)
    if car is not None:
        try:
            car_row, periods = await _rentals(request).calendar(car, start, end)
        except DomainError as err:
            return render_refused(request, "rentals.html", session, err, **context)
        context.update(
            car_row=car_row,
            periods=periods,
            bars=timeline(periods, start, end),
            height=TOP + max(1, len(periods)) * ROW_H,
        )
    return render(request, "rentals.html", session, error=None, **context)


def _key(b: Booking) -> tuple[int, int]:
    return time_key(b.created_at, b.id)


@router.get("/rentals/bookings", response_class=HTMLResponse)
async def bookings(
    request: Request,
    session: SignedIn,
    customer: Id = None,
    status: Annotated[str | None, Query(max_length=20)] = None,
    after: Annotated[str | None, Query(max_length=200)] = None,
) -> HTMLResponse:
    """A customer's bookings, newest first, of one status or all."""
    items: list[dict[str, Any]] = []
    nxt = None
    status = status or None  # the form's "any"
    if status is not None and status not in STATUSES:
        return render(
            request,
            "rentals_bookings.html",
            session,
            status=422,
            customer=customer,
            chosen=None,
            statuses=STATUSES,
            items=[],
            next=None,
            error=f"no booking status {status!r}",
        )
    if customer is not None:
        try:
            # The API's cursor rule: a time outside the accepted range is no
            # cursor of ours (it was a 500: past year 9999).
            cursor = time_cursor(after or None)
        except DomainError as err:
            return render_refused(
                request,
                "rentals_bookings.html",
                session,
                err,
                customer=customer,
                chosen=status,
                statuses=STATUSES,
                items=[],
                next=None,
            )
        rows = await _rentals(request).customer_bookings(customer, cursor, PAGE + 1, status)
        items, nxt = page(rows, PAGE, _key)
    return render(
        request,
        "rentals_bookings.html",
        session,
        customer=customer,
        chosen=status,
        statuses=STATUSES,
        items=items,
        next=nxt,
        error=None,
    )
