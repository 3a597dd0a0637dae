"""The sandbox payment page behind a booking's paymentUrl.

Mounted only when the sandbox gateway was chosen explicitly. Its button makes the
sandbox gateway send the signed webhook through the same verification path as a
real provider's, so `reservo up --demo` can be tried by hand end to end.

A browser follows the link without a bearer token, so the link itself is the
credential: ``?token=`` is an HMAC of the booking id (gateway.link_token) that only
the booking's own responses (its customer, host or an admin) carry. Without the
right token both GET and POST answer the same 404 as a booking that does not exist,
and the form posts the token back in a hidden field as the proof behind the state
change. The POST pays only a live HOLD, always as the same transaction
(``sandbox-<id>``), so a double submit pays once."""

from __future__ import annotations

import base64
import hashlib
import html
from typing import Annotated
from urllib.parse import parse_qs

from fastapi import APIRouter, Path, Query, Request
from fastapi.responses import HTMLResponse

from reservo.core.http.route_inputs import PathId
from reservo.core.kernel.errors import DomainError
from reservo.core.kernel.payments import APPOINTMENT_PAYMENTS, PaymentHandler
from reservo.rentals import domain
from reservo.rentals.api import process_webhook, svc_of
from reservo.rentals.gateway import SandboxGateway

router = APIRouter(prefix="/sandbox", tags=["rentals sandbox"], include_in_schema=False)
# The form carries one short field; anything bigger is not our form.
MAX_FORM_BYTES = 1024

_STYLE = (
    "body{font-family:sans-serif;max-width:32em;margin:3em auto}\n"
    "button{font-size:1.2em;padding:.4em 1.2em}"
)
_PAGE = """<!doctype html>
<html><head><meta charset="utf-8"><title>Sandbox payment</title>
<meta name="referrer" content="no-referrer">
<style>{style}</style></head>
<body><h1>Sandbox payment gateway</h1>
<p>Booking <b>#{booking_id}</b>, car #{car_id}, {start} &rarr; {end}</p>
<p>Status: <b>{status}</b></p>
<p>Deposit: <b>{amount}</b> (minor units)</p>
{action}
<p><small>No money moves: this page stands in for a payment provider.</small></p>
</body></html>"""


# The page acts on a click, so no other site may frame it (clickjacking: a
# transparent frame over a decoy button). It runs no script and loads nothing;
# its one inline style is allowed by its hash. The link's token is in the URL:
# never sent on as a referrer, never cached.
_STYLE_HASH = base64.b64encode(hashlib.sha256(_STYLE.encode()).digest()).decode()
PAGE_HEADERS = {
    "Cache-Control": "no-store",
    "Content-Security-Policy": (
        f"default-src 'none'; style-src 'sha256-{_STYLE_HASH}'; form-action 'self'; "
        "frame-ancestors 'none'; base-uri 'none'"
    ),
    "X-Frame-Options": "DENY",
    "X-Content-Type-Options": "nosniff",
    "Referrer-Policy": "no-referrer",
}


def _not_found() -> DomainError:
    # The same answer as an unknown booking: a wrong token reveals nothing.
    return DomainError("not_found", "no such payment page")


def _checked(request: Request, booking_id: int, token: str | None) -> tuple[SandboxGateway, str]:
    gateway = request.app.state.rentals_gateway
    if (
        not isinstance(gateway, SandboxGateway)
        or token is None
        or not gateway.link_token_ok(booking_id, token)
    ):
        raise _not_found()
    return gateway, token


async def _page(request: Request, booking_id: int, token: str, message: str = "") -> HTMLResponse:
    svc = svc_of(request)
    b = await svc.get(booking_id)
    status = domain.effective_status(b.status, b.hold_expires_at, svc.clock.now())
    action = (
        '<form method="post">'
        f'<input type="hidden" name="token" value="{html.escape(token)}">'
        f'<button type="submit">Pay {b.deposit_amount}</button></form>'
        if status == "HOLD"
        else ""
    )
    if message:
        action = f"<p>Gateway result: <b>{html.escape(message)}</b></p>" + action
    return HTMLResponse(
        _PAGE.format(
            booking_id=b.id,
            car_id=b.car_id,
            start=html.escape(b.from_at.isoformat()),
            end=html.escape(b.return_at.isoformat()),
            status=html.escape(status),
            amount=b.deposit_amount,
            action=action,
            style=_STYLE,
        ),
        headers=PAGE_HEADERS,
    )


@router.get("/pay/{bookingId}", response_class=HTMLResponse)
async def pay_page(
    booking_id: Annotated[PathId, Path(alias="bookingId")],
    request: Request,
    token: Annotated[str | None, Query(max_length=128)] = None,
) -> HTMLResponse:
    _, checked = _checked(request, booking_id, token)
    return await _page(request, booking_id, checked)


async def _posted_token(request: Request) -> str | None:
    raw = await request.body()
    if len(raw) > MAX_FORM_BYTES:
        return None
    try:
        values = parse_qs(raw.decode("latin-1"), max_num_fields=4).get("token")
    except ValueError:  # too many fields: not our form
        return None
    return values[0] if values else None


@router.post("/pay/{bookingId}", response_class=HTMLResponse)
async def pay(
    booking_id: Annotated[PathId, Path(alias="bookingId")], request: Request
) -> HTMLResponse:
    """Only the form's hidden token counts (not the query string): it is the proof
    that whoever asks for the payment was given this booking's link."""
    gateway, token = _checked(request, booking_id, await _posted_token(request))
    svc = svc_of(request)
    b = await svc.get(booking_id)
    status = domain.effective_status(b.status, b.hold_expires_at, svc.clock.now())
    if status != "HOLD":
        # Paid, cancelled or run out: nothing to pay, nothing is sent.
        return await _page(request, booking_id, token, f"nothing to pay: booking is {status}")
    raw, signature = gateway.checkout(
        booking_id, b.deposit_amount, int(svc.clock.now().timestamp())
    )
    result = await process_webhook(request, raw, signature)
    return await _page(request, booking_id, token, result)


# -- a prepaid appointment's page (the same gateway pays a HELD appointment) -----------

APPOINTMENT = "appointmentId"
_APPOINTMENT_PAGE = """<!doctype html>
<html><head><meta charset="utf-8"><title>Sandbox payment</title>
<meta name="referrer" content="no-referrer">
<style>{style}</style></head>
<body><h1>Sandbox payment gateway</h1>
<p>Appointment <b>#{appointment_id}</b></p>
<p>{due}</p>
{action}
<p><small>No money moves: this page stands in for a payment provider.</small></p>
</body></html>"""


def _appointments(request: Request) -> PaymentHandler:
    handler: PaymentHandler | None = getattr(request.app.state, APPOINTMENT_PAYMENTS, None)
    if handler is None:
        raise _not_found()
    return handler


def _checked_appointment(
    request: Request, appointment_id: int, token: str | None
) -> tuple[SandboxGateway, str]:
    gateway = request.app.state.rentals_gateway
    if (
        not isinstance(gateway, SandboxGateway)
        or token is None
        or not gateway.link_token_ok(appointment_id, token, APPOINTMENT)
    ):
        raise _not_found()
    return gateway, token


async def _appointment_page(
    request: Request, appointment_id: int, token: str, message: str = ""
) -> HTMLResponse:
    due = await _appointments(request).payment_due(appointment_id)
    action = (
        '<form method="post">'
        f'<input type="hidden" name="token" value="{html.escape(token)}">'
        f'<button type="submit">Pay {due}</button></form>'
        if due is not None
        else ""
    )
    if message:
        action = f"<p>Gateway result: <b>{html.escape(message)}</b></p>" + action
    text = f"Price: <b>{due}</b> (minor units)" if due is not None else "Nothing to pay."
    return HTMLResponse(
        _APPOINTMENT_PAGE.format(
            appointment_id=appointment_id, due=text, action=action, style=_STYLE
        ),
        headers=PAGE_HEADERS,
    )


@router.get("/pay-appointment/{appointmentId}", response_class=HTMLResponse)
async def pay_appointment_page(
    appointment_id: Annotated[PathId, Path(alias="appointmentId")],
    request: Request,
    token: Annotated[str | None, Query(max_length=128)] = None,
) -> HTMLResponse:
    _, checked = _checked_appointment(request, appointment_id, token)
    return await _appointment_page(request, appointment_id, checked)


@router.post("/pay-appointment/{appointmentId}", response_class=HTMLResponse)
async def pay_appointment(
    appointment_id: Annotated[PathId, Path(alias="appointmentId")], request: Request
) -> HTMLResponse:
    """Pays a HELD appointment's price as one sandbox transaction, through the
    signed webhook; only the form's hidden token counts, as for a booking."""
    gateway, token = _checked_appointment(request, appointment_id, await _posted_token(request))
    due = await _appointments(request).payment_due(appointment_id)
    if due is None:
        return await _appointment_page(request, appointment_id, token, "nothing to pay")
    now = int(request.app.state.clock.now().timestamp())
    raw, signature = gateway.checkout(appointment_id, due, now, APPOINTMENT)
    result = await process_webhook(request, raw, signature)
    return await _appointment_page(request, appointment_id, token, result)
