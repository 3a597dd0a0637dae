"""The sandbox payment page behind a booking's paymentUrl.

Only served when the sandbox gateway is configured. Its button makes the sandbox
gateway send the signed webhook through the same verification path as a real
provider's, so `reservo up --demo` can be tried by hand end to end."""

from __future__ import annotations

import html
from typing import Annotated

from fastapi import APIRouter, Path, Request
from fastapi.responses import HTMLResponse

from reservo.core.errors import DomainError
from reservo.rentals.api import process_webhook, svc_of
from reservo.rentals.gateway import SandboxGateway

router = APIRouter(prefix="/sandbox", tags=["rentals sandbox"], include_in_schema=False)
PathId = Annotated[int, Path(ge=1, le=2**63 - 1)]

_PAGE = """<!doctype html>
<html><head><meta charset="utf-8"><title>Sandbox payment</title>
<style>body{{font-family:sans-serif;max-width:32em;margin:3em auto}}
button{{font-size:1.2em;padding:.4em 1.2em}}</style></head>
<body><h1>Sandbox payment gateway</h1>
<p>Booking <b>#{booking_id}</b>, car #{car_id}, {start} &rarr; {end}</p>
<p>Status: <b>{status}</b></p>
<p>Deposit: <b>{amount}</b> (minor units)</p>
{action}
<p><small>No money moves: this page stands in for a payment provider.</small></p>
</body></html>"""


def _gateway(request: Request) -> SandboxGateway:
    gateway = request.app.state.container.rentals_gateway
    if not isinstance(gateway, SandboxGateway):
        raise DomainError("not_found", "the sandbox gateway is not enabled", status=404)
    return gateway


async def _page(request: Request, booking_id: int, message: str = "") -> HTMLResponse:
    _gateway(request)
    b = await svc_of(request).get(booking_id)
    action = (
        f'<form method="post"><button type="submit">Pay {b["deposit_amount"]}</button></form>'
        if b["status"] == "HOLD"
        else ""
    )
    if message:
        action = f"<p>Gateway result: <b>{html.escape(message)}</b></p>" + action
    return HTMLResponse(
        _PAGE.format(
            booking_id=b["id"],
            car_id=b["car_id"],
            start=html.escape(b["from_at"].isoformat()),
            end=html.escape(b["return_at"].isoformat()),
            status=html.escape(b["status"]),
            amount=b["deposit_amount"],
            action=action,
        )
    )


@router.get("/pay/{bookingId}", response_class=HTMLResponse)
async def pay_page(
    booking_id: Annotated[PathId, Path(alias="bookingId")], request: Request
) -> HTMLResponse:
    return await _page(request, booking_id)


@router.post("/pay/{bookingId}", response_class=HTMLResponse)
async def pay(
    booking_id: Annotated[PathId, Path(alias="bookingId")], request: Request
) -> HTMLResponse:
    gateway = _gateway(request)
    svc = svc_of(request)
    b = await svc.get(booking_id)
    raw, signature = gateway.checkout(
        booking_id, b["deposit_amount"], int(svc.clock.now().timestamp())
    )
    result = await process_webhook(request, raw, signature)
    return await _page(request, booking_id, result)
