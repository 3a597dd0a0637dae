"""HTTP routes of the Rentals API: parse, authorize, call the service, render."""

from __future__ import annotations

from collections.abc import Awaitable
from functools import partial
from typing import Annotated, Any

import orjson
from fastapi import APIRouter, Header, Path, Query, Request
from fastapi.responses import JSONResponse, Response
from pydantic import ValidationError

from reservo.core.http.auth import Principal, verify_webhook
from reservo.core.http.callers import AdminCaller, Caller, role_caller
from reservo.core.http.idempotency import Within, validate_key
from reservo.core.http.idempotent import (
    IdempotencyKey,
    RequiredIdempotencyKey,
    required_key,
    run_idempotent_route,
)
from reservo.core.http.json_intake import check_json
from reservo.core.http.openapi import raises, raw_body
from reservo.core.http.pagination import (
    DEFAULT_LIMIT,
    After,
    Limit,
    decode_cursor,
    page,
    time_cursor,
    time_key,
)
from reservo.core.http.responses import json_response, model_from
from reservo.core.http.route_inputs import PathId, from_state
from reservo.core.http.schemas import Instant
from reservo.core.kernel.errors import DomainError, model_issues, validation_error
from reservo.core.kernel.payments import APPOINTMENT_PAYMENTS, PaymentHandler
from reservo.rentals import domain
from reservo.rentals.domain import Booking, Car
from reservo.rentals.gateway import WebhookKey
from reservo.rentals.schemas import (
    BookingIn,
    BookingOut,
    BookingPage,
    BookingStatus,
    Calendar,
    CalendarPeriod,
    CarIn,
    CarPage,
    City,
    QuoteOut,
    WebhookIn,
    WebhookOut,
)
from reservo.rentals.schemas import Car as CarOut
from reservo.rentals.service import RentalService

router = APIRouter(prefix="/api", tags=["rentals"])


svc_of = from_state(RentalService, "rentals")
# Who may use which route, checked before the request is parsed (core.http.callers.Roles).
Customer = Annotated[Principal, role_caller("customer")]
Host = Annotated[Principal, role_caller("host")]
CustomerOrHost = Annotated[Principal, role_caller("customer", "host")]


def render(svc: RentalService, b: Booking) -> dict[str, Any]:
    # A HOLD past its expiry is shown as EXPIRED even before a job flipped it.
    status = domain.effective_status(b.status, b.hold_expires_at, svc.clock.now())
    live_hold = status == "HOLD"
    return model_from(
        BookingOut,
        b,
        booking_id=b.id,
        from_=b.from_at,
        to=b.return_at,
        status=status,
        hold_expires_at=b.hold_expires_at if live_hold else None,
        payment_url=svc.payment_url(b.id) if live_hold else None,
    ).wire()


def render_car(c: Car) -> dict[str, Any]:
    """A car on the wire (CarOut), built by hand: the search renders many."""
    return {
        "id": c.id,
        "plate": c.plate,
        "model": c.model,
        "city": c.city,
        "dailyPrice": c.daily_price,
        "hostId": c.host_id,
    }


def render_car_page(cars: list[Car], limit: int) -> bytes:
    """A search page (``limit + 1`` cars fetched: the extra one only says another
    page exists), cheapest first, the cursor (daily_price, id) of its last car."""
    items, nxt = page(cars, limit, lambda c: (c.daily_price, c.id))
    return orjson.dumps({"items": [render_car(c) for c in items], "next": nxt})


# -- cars ----------------------------------------------------------------------


@router.post(
    "/cars",
    status_code=201,
    response_model=CarOut,
    operation_id="createCar",
    openapi_extra=raises("plate_taken"),
)
async def create_car(
    body: CarIn, caller: AdminCaller, request: Request, idempotency_key: IdempotencyKey = None
) -> JSONResponse:
    """Adds a car (admin) to a host's fleet in a city at a daily price; a plate
    is registered once (`plate_taken`)."""
    key = validate_key(idempotency_key, required=False)
    svc = svc_of(request)

    def create(within: Within[Car] | None) -> Awaitable[Car]:
        return svc.create_car(
            body.plate, body.model, body.city, body.daily_price, body.host_id, within
        )

    return await run_idempotent_route(request, caller, "POST /api/cars", key, create, render_car)


@router.get("/cars", response_model=CarPage, operation_id="searchCars", openapi_extra=raises())
async def search_cars(
    city: Annotated[City, Query()],
    from_: Annotated[Instant, Query(alias="from")],
    to: Annotated[Instant, Query()],
    caller: Caller,
    request: Request,
    limit: Limit = DEFAULT_LIMIT,
    after: After = None,
) -> Response:
    """Cars of a city free for the whole [from, to) (turnaround included),
    cheapest first (dailyPrice, then id), a page at a time (`{items, next}`; pass
    `next` as `after` for the following page). A page may be up to
    RESERVO_RENTALS_SEARCH_CACHE_TTL_S stale; booking is not."""
    cursor = None if after is None else decode_cursor(after, int, int)
    body = await svc_of(request).search(city, from_, to, limit, cursor, render_car_page)
    return Response(body, media_type="application/json")


# Served on the fast path (core/http/hotroute.py).
HOT_ROUTES = (search_cars,)


# -- bookings ------------------------------------------------------------------


@router.post(
    "/bookings",
    status_code=201,
    response_model=BookingOut,
    operation_id="holdCar",
    openapi_extra=raises(
        "car_not_found", "car_unavailable", "rate_limited", "payment_gateway_unconfigured"
    ),
)
async def hold(
    body: BookingIn,
    caller: Customer,
    request: Request,
    idempotency_key: RequiredIdempotencyKey = None,
) -> JSONResponse:
    """Holds the car for the customer (the caller) over the period, until the
    booking is paid through the gateway. Two bookings of one car never overlap:
    the later one is `car_unavailable`."""
    caller.require_owner("customer", body.customer_id)
    key = required_key(idempotency_key)
    svc = svc_of(request)

    async def hold_once(within: Within[Booking] | None) -> Booking:
        # The hold counts itself against the rate limit, in its own transaction.
        return await svc.hold(body.car_id, body.customer_id, body.from_, body.to, within)

    return await run_idempotent_route(
        request, caller, "POST /api/bookings", key, hold_once, partial(render, svc)
    )


def _who(caller: Principal, b: Booking, *, customer: bool) -> domain.Canceller:
    """admin, the car's host, or (when ``customer``) the booking's customer."""
    if caller.is_admin:
        return "admin"
    if caller.role == "host" and caller.sub == b.host_id:
        return "host"
    if customer and caller.role == "customer" and caller.sub == b.customer_id:
        return "customer"
    # Somebody else's booking is answered as one that does not exist: a 403
    # would tell which ids exist.
    raise DomainError("booking_not_found", f"no booking {b.id}")


async def _authorized(
    request: Request, caller: Principal, booking_id: int, *, customer: bool
) -> tuple[Booking, domain.Canceller]:
    """The booking and who acts on it; the route's role rule ran before."""
    b = await svc_of(request).get(booking_id)
    return b, _who(caller, b, customer=customer)


@router.get(
    "/bookings/{bookingId}",
    response_model=BookingOut,
    operation_id="getBooking",
    openapi_extra=raises("booking_not_found"),
)
async def get_booking(
    booking_id: Annotated[PathId, Path(alias="bookingId")], caller: CustomerOrHost, request: Request
) -> JSONResponse:
    """One booking, to its customer, the car's host or an admin; anybody
    else's is `booking_not_found`, as if it did not exist."""
    b, _ = await _authorized(request, caller, booking_id, customer=True)
    return json_response(200, render(svc_of(request), b))


@router.post(
    "/bookings/{bookingId}/cancel",
    response_model=BookingOut,
    operation_id="cancelBooking",
    openapi_extra=raises("booking_not_found", "not_cancellable"),
)
async def cancel(
    booking_id: Annotated[PathId, Path(alias="bookingId")], caller: CustomerOrHost, request: Request
) -> JSONResponse:
    """A customer cancelling a CONFIRMED booking >= 72 h before `from` gets 100 %
    of the deposit, >= 24 h 50 %, else 0; the host (or an admin) refunds 100 %.
    A HOLD may be cancelled (refund 0). Cancelling again returns the booking.
    The customer, the car's host or an admin; anybody else's booking is
    `booking_not_found`, as if it did not exist (a 403 would tell which ids
    exist)."""
    _, by = await _authorized(request, caller, booking_id, customer=True)
    svc = svc_of(request)
    return json_response(200, render(svc, await svc.cancel(booking_id, by)))


@router.post(
    "/bookings/{bookingId}/extend-hold",
    response_model=BookingOut,
    operation_id="extendHold",
    openapi_extra=raises("booking_not_found", "hold_extended", "hold_expired", "invalid_state"),
)
async def extend_hold(
    booking_id: Annotated[PathId, Path(alias="bookingId")], caller: Customer, request: Request
) -> JSONResponse:
    """The booking's customer (or an admin) extends its HOLD once:
    `holdExpiresAt` moves RESERVO_RENTALS_HOLD_EXTENSION_S (default 900 s) later.
    409 `hold_expired` once the hold's time has passed (even before the expiry
    job flipped it), `hold_extended` the second time, `invalid_state` for a
    booking no longer a HOLD; someone else's booking is 404."""
    b = await svc_of(request).get(booking_id)
    if not caller.owns("customer", b.customer_id):
        raise DomainError("booking_not_found", f"no booking {booking_id}")
    svc = svc_of(request)
    return json_response(200, render(svc, await svc.extend_hold(booking_id)))


@router.post(
    "/bookings/{bookingId}/pickup",
    response_model=BookingOut,
    operation_id="pickUpCar",
    openapi_extra=raises("booking_not_found", "invalid_state", "pickup_too_early"),
)
async def pickup(
    booking_id: Annotated[PathId, Path(alias="bookingId")], caller: Host, request: Request
) -> JSONResponse:
    """The car's host (or an admin) hands the car over: CONFIRMED becomes
    ON_TRIP, from RESERVO_RENTALS_PICKUP_LEAD_MINUTES before `from` on (409
    `pickup_too_early` before that). Another host's booking is
    `booking_not_found`, as if it did not exist (a 403 would tell which ids
    exist)."""
    await _authorized(request, caller, booking_id, customer=False)
    svc = svc_of(request)
    return json_response(200, render(svc, await svc.pick_up(booking_id)))


@router.post(
    "/bookings/{bookingId}/return",
    response_model=BookingOut,
    operation_id="returnCar",
    openapi_extra=raises("booking_not_found", "invalid_state"),
)
async def return_car(
    booking_id: Annotated[PathId, Path(alias="bookingId")], caller: Host, request: Request
) -> JSONResponse:
    """The car's host (or an admin) marks the car returned: ON_TRIP becomes
    COMPLETED; a booking in any other state is `invalid_state`. Another host's
    booking is `booking_not_found`, as if it did not exist (a 403 would tell
    which ids exist)."""
    await _authorized(request, caller, booking_id, customer=False)
    svc = svc_of(request)
    return json_response(200, render(svc, await svc.return_car(booking_id)))


# -- payments ------------------------------------------------------------------


async def process_webhook(request: Request, raw: bytes, signature: str | None) -> str:
    """Verify the signature on the raw bytes first; only then parse and act."""
    key: WebhookKey = request.app.state.rentals_webhook
    verify_webhook(key.secret, signature, raw, request.app.state.clock.now(), key.tolerance_s)
    # The JSON rules of every body (a key twice is 422 duplicate_key), whatever
    # Content-Type the gateway sent: the model's own reader would take a
    # repeated key's last value.
    check_json(raw)
    try:
        body = WebhookIn.model_validate_json(raw)
    except ValidationError as exc:
        errors = model_issues(exc.errors(include_url=False), "body")
        raise validation_error("the webhook body is not valid", errors) from None
    if body.appointment_id is not None:
        # A prepaid appointment's payment: settled by the module that offers it.
        appointments: PaymentHandler | None = getattr(request.app.state, APPOINTMENT_PAYMENTS, None)
        if appointments is None:
            raise DomainError("appointment_not_found", f"no appointment {body.appointment_id}")
        return await appointments.on_payment(
            body.appointment_id, body.provider_txn_id, body.amount, body.status
        )
    assert body.booking_id is not None  # WebhookIn: exactly one of the two
    return await svc_of(request).on_payment(
        body.booking_id, body.provider_txn_id, body.amount, body.status
    )


@router.post(
    "/payments/webhook",
    response_model=WebhookOut,
    operation_id="receivePayment",
    openapi_extra={
        **raises(
            "bad_signature",
            "payload_too_large",
            "duplicate_key",
            "booking_not_found",
            "appointment_not_found",
            "not_held",
        ),
        **raw_body(WebhookIn),
    },
)
async def payment_webhook(
    request: Request,
    x_signature: Annotated[
        str | None, Header(alias="X-Signature", description="t=<unix s>,v1=<hex HMAC-SHA256>")
    ] = None,
) -> JSONResponse:
    """Signed by the gateway (never bearer-authenticated); every SUCCEEDED payment
    is recorded once per providerTxnId. `confirmed` (exactly the deposit of a live
    HOLD), `overpaid` (more than the deposit of a live HOLD: confirmed, and the
    excess, `amount` minus the deposit, is refunded; the booking shows it as
    `overpaidRefund`), `duplicate` (that providerTxnId was already processed:
    nothing changes, nothing is refunded again), `refund_requested` (below the
    deposit, or the booking was no longer a live HOLD: the full amount goes back,
    nothing is confirmed) or `ignored` (a FAILED payment, or one of 0: nothing to
    confirm or refund).

    The body names exactly one of `bookingId` (a rental's deposit) and
    `appointmentId` (a prepaid appointment's price), else 422. For an
    appointment the same results apply to its HELD seat: `confirmed` or
    `overpaid` (HELD -> BOOKED; the appointment shows `overpaidRefund`),
    `refund_requested` (below the price, or the hold ended, was cancelled or
    paid: refunded in full), `duplicate`; 404 `appointment_not_found`, 409
    `not_held` for an appointment that was never held (no price was due)."""
    result = await process_webhook(request, await request.body(), x_signature)
    return json_response(200, WebhookOut(result=result).wire())  # type: ignore[arg-type]


# -- second release: a customer's bookings, a car's calendar, a quote ------------------


def _booking_key(b: Booking) -> tuple[int, int]:
    """A booking's place in its customer's list, (createdAt, id): the cursor of
    the page it ends."""
    return time_key(b.created_at, b.id)


@router.get(
    "/customers/{customerId}/bookings",
    response_model=BookingPage,
    operation_id="listCustomerBookings",
    openapi_extra=raises(),
)
async def customer_bookings(
    customer_id: Annotated[PathId, Path(alias="customerId")],
    caller: Customer,
    request: Request,
    status: Annotated[
        BookingStatus | None,
        Query(
            description="only bookings of this status; a HOLD past its expiry is EXPIRED "
            "(as GET /api/bookings/{bookingId} shows it) even before a job flipped it"
        ),
    ] = None,
    limit: Limit = DEFAULT_LIMIT,
    after: After = None,
) -> JSONResponse:
    """The customer's bookings, newest first (createdAt, then id), as
    GET /api/bookings/{bookingId} shows each. The customer themself or an admin; anyone
    else is 403 whether the customer has bookings or not."""
    caller.require_owner("customer", customer_id)
    svc = svc_of(request)
    rows = await svc.customer_bookings(customer_id, time_cursor(after), limit + 1, status)
    items, nxt = page(rows, limit, _booking_key)
    return json_response(200, {"items": [render(svc, b) for b in items], "next": nxt})


@router.get(
    "/cars/{carId}/calendar",
    response_model=Calendar,
    operation_id="getCarCalendar",
    openapi_extra=raises("car_not_found"),
)
async def car_calendar(
    car_id: Annotated[PathId, Path(alias="carId")],
    from_: Annotated[Instant, Query(alias="from")],
    to: Annotated[Instant, Query(description="exclusive; at most 366 days after `from`")],
    caller: Host,
    request: Request,
) -> JSONResponse:
    """What blocks the car during [from, to): its live bookings (HOLD not yet
    expired, CONFIRMED, ON_TRIP) whose period or turnaround buffer overlaps the
    window, in time order. `to` is the customer's end, `bufferUntil` the end of
    the buffer after it (the next trip may start then). Past and dropped bookings
    (COMPLETED, CANCELLED, EXPIRED) block nothing and are not listed. The car's
    host or an admin (403 for other roles; another host's car is 404 car_not_found,
    as one that does not exist)."""
    car, rows = await svc_of(request).calendar(car_id, from_, to)
    if not caller.owns("host", car.host_id):
        raise DomainError("car_not_found", f"no car {car_id}")
    periods = [model_from(CalendarPeriod, p, from_=p.from_at, to=p.return_at) for p in rows]
    return json_response(200, Calendar(car_id=car_id, periods=periods).wire())


@router.get(
    "/cars/{carId}/quote",
    response_model=QuoteOut,
    operation_id="getCarQuote",
    openapi_extra=raises("car_not_found"),
)
async def car_quote(
    car_id: Annotated[PathId, Path(alias="carId")],
    from_: Annotated[Instant, Query(alias="from")],
    to: Annotated[Instant, Query()],
    caller: Caller,
    request: Request,
) -> JSONResponse:
    """What a hold of [from, to) would cost: started days, days x dailyPrice, and
    the deposit the hold would charge (ceil(days) x dailyPrice x
    RESERVO_RENTALS_DEPOSIT_RATE). `available`: the car is free for the period plus
    the turnaround buffer right now (an expired HOLD does not count); a hold
    decides for good. The periods a hold refuses (past, reversed, over 90 days,
    over 730 days ahead) are 422 here too. Anyone authenticated."""
    car, q, free = await svc_of(request).quote(car_id, from_, to)
    body = QuoteOut(
        car_id=car.id, days=q.days, price=q.price, deposit_amount=q.deposit, available=free
    )
    return json_response(200, body.wire())
