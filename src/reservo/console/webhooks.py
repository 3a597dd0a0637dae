"""The webhooks page: the endpoints subscribers registered, each one's recent
deliveries, and a delivery's redelivery. The list and the redelivery are the
webhooks module's use cases (``request.app.state.webhooks``), the redelivery
the very one POST /api/webhook-deliveries/{id}/redeliver calls."""

from __future__ import annotations

from typing import Annotated

from fastapi import Path, Query, Request
from fastapi.responses import HTMLResponse, RedirectResponse, Response
from fastapi.routing import APIRouter

from reservo.console.web import SignedIn, Verified, render, render_refused
from reservo.core.kernel.errors import DomainError
from reservo.webhooks import DELIVERY_STATUSES, Webhooks

router = APIRouter(prefix="/console", include_in_schema=False)
RECENT = 50
Id = Annotated[int, Path(ge=1, le=2**63 - 1)]


def _service(request: Request) -> Webhooks:
    service: Webhooks = request.app.state.webhooks
    return service


@router.get("/webhooks", response_class=HTMLResponse)
async def endpoints(request: Request, session: SignedIn) -> HTMLResponse:
    return render(request, "webhooks.html", session, endpoints=await _service(request).endpoints())


async def _endpoint_page(
    request: Request,
    session: SignedIn,
    endpoint_id: int,
    status: str,
    error: str | None = None,
    code: int = 200,
) -> HTMLResponse:
    service = _service(request)
    try:
        endpoint = await service.endpoint(endpoint_id)
        found = await service.deliveries(endpoint_id, status or None, RECENT)
    except DomainError as err:
        return render_refused(
            request, "webhook.html", session, err, endpoint=None, deliveries=[], status_filter=""
        )
    return render(
        request,
        "webhook.html",
        session,
        status=code,
        error=error,
        endpoint=endpoint,
        deliveries=found,
        statuses=DELIVERY_STATUSES,
        status_filter=status,
    )


@router.get("/webhooks/{endpoint_id}", response_class=HTMLResponse)
async def endpoint(
    request: Request,
    session: SignedIn,
    endpoint_id: Id,
    status: Annotated[str, Query(pattern="^(|PENDING|DELIVERED|FAILED)$")] = "",
) -> HTMLResponse:
    return await _endpoint_page(request, session, endpoint_id, status)


@router.post("/webhooks/{endpoint_id}/deliveries/{delivery_id}/redeliver", response_model=None)
async def redeliver(
    request: Request, session: Verified, endpoint_id: Id, delivery_id: Id
) -> Response:
    """Queues the delivery again (once, however often the button is pressed
    while it is PENDING). A refusal shows on the page."""
    try:
        await _service(request).redeliver(delivery_id)
    except DomainError as err:
        return await _endpoint_page(request, session, endpoint_id, "", err.detail, err.status)
    return RedirectResponse(f"/console/webhooks/{endpoint_id}", status_code=303)
