"""HTTP routes of outgoing webhooks (admin only): endpoints, their deliveries,
a redelivery. Parse, authorize, call the service, render."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Path, Query, Request, Response
from fastapi.responses import JSONResponse

from reservo.core.http.callers import AdminCaller
from reservo.core.http.openapi import raises
from reservo.core.http.pagination import DEFAULT_LIMIT, Limit
from reservo.core.http.responses import json_response, model_from
from reservo.core.http.route_inputs import PathId, from_state
from reservo.webhooks.domain import Delivery, Endpoint
from reservo.webhooks.schemas import (
    DeliveryOut,
    DeliveryStatus,
    EndpointCreated,
    EndpointIn,
    EndpointOut,
    EndpointPatch,
    SecretOut,
)
from reservo.webhooks.service import Webhooks

router = APIRouter(prefix="/api", tags=["webhooks"])
_svc = from_state(Webhooks, "webhooks")
EndpointId = Annotated[PathId, Path(alias="endpointId")]
DeliveryId = Annotated[PathId, Path(alias="deliveryId")]


def render(e: Endpoint) -> dict[str, object]:
    return model_from(EndpointOut, e).wire()


def render_delivery(d: Delivery) -> dict[str, object]:
    return model_from(DeliveryOut, d).wire()


@router.post(
    "/webhook-endpoints",
    status_code=201,
    response_model=EndpointCreated,
    operation_id="createWebhookEndpoint",
    openapi_extra=raises("url_not_allowed", "unknown_event_type"),
)
async def create_endpoint(body: EndpointIn, caller: AdminCaller, request: Request) -> JSONResponse:
    """Subscribes `url` to the event types listed. Each event is POSTed as its
    CloudEvents JSON (structured mode), signed the Standard Webhooks way
    (`webhook-id`, `webhook-timestamp`, `webhook-signature`). The signing secret
    is in this answer and in a rotation's only."""
    e = await _svc(request).create(body.url, body.events, body.description)
    return json_response(201, model_from(EndpointCreated, e).wire())


@router.get(
    "/webhook-endpoints",
    response_model=list[EndpointOut],
    operation_id="listWebhookEndpoints",
    openapi_extra=raises(),
)
async def list_endpoints(caller: AdminCaller, request: Request) -> JSONResponse:
    """Every endpoint, oldest first (no secrets)."""
    return json_response(200, [render(e) for e in await _svc(request).endpoints()])


@router.patch(
    "/webhook-endpoints/{endpointId}",
    response_model=EndpointOut,
    operation_id="updateWebhookEndpoint",
    openapi_extra=raises("webhook_endpoint_not_found", "unknown_event_type"),
)
async def update_endpoint(
    endpoint_id: EndpointId, body: EndpointPatch, caller: AdminCaller, request: Request
) -> JSONResponse:
    """Changes the event types, the description or the status. A DISABLED
    endpoint gets no new deliveries and its pending ones fail at their next
    attempt; enabling it again starts its five days of failures afresh."""
    e = await _svc(request).update(endpoint_id, body.events, body.description, body.status)
    return json_response(200, render(e))


@router.delete(
    "/webhook-endpoints/{endpointId}",
    status_code=204,
    operation_id="deleteWebhookEndpoint",
    openapi_extra=raises("webhook_endpoint_not_found"),
)
async def delete_endpoint(
    endpoint_id: EndpointId, caller: AdminCaller, request: Request
) -> Response:
    """Deletes the endpoint; its pending deliveries are dropped."""
    await _svc(request).delete(endpoint_id)
    return Response(status_code=204)


@router.post(
    "/webhook-endpoints/{endpointId}/rotate-secret",
    response_model=SecretOut,
    operation_id="rotateWebhookSecret",
    openapi_extra=raises("webhook_endpoint_not_found"),
)
async def rotate_secret(
    endpoint_id: EndpointId, caller: AdminCaller, request: Request
) -> JSONResponse:
    """A new signing secret; for 24 h every message carries two signatures
    (the new secret's and the previous one's), so either verifies."""
    secret = await _svc(request).rotate(endpoint_id)
    return json_response(200, SecretOut(secret=secret).wire())


@router.get(
    "/webhook-endpoints/{endpointId}/deliveries",
    response_model=list[DeliveryOut],
    operation_id="listWebhookDeliveries",
    openapi_extra=raises("webhook_endpoint_not_found"),
)
async def list_deliveries(
    endpoint_id: EndpointId,
    caller: AdminCaller,
    request: Request,
    status: Annotated[
        DeliveryStatus | None, Query(description="only deliveries in this status")
    ] = None,
    limit: Limit = DEFAULT_LIMIT,
) -> JSONResponse:
    """The endpoint's deliveries, newest first."""
    found = await _svc(request).deliveries(endpoint_id, status, limit)
    return json_response(200, [render_delivery(d) for d in found])


@router.post(
    "/webhook-deliveries/{deliveryId}/redeliver",
    status_code=202,
    response_model=DeliveryOut,
    operation_id="redeliverWebhook",
    openapi_extra=raises("webhook_delivery_not_found"),
)
async def redeliver(delivery_id: DeliveryId, caller: AdminCaller, request: Request) -> JSONResponse:
    """Queues a DELIVERED or FAILED delivery again now, with a fresh retry
    window. A PENDING one is queued already: asking changes nothing. Asked
    twice at once, it is queued once."""
    return json_response(202, render_delivery(await _svc(request).redeliver(delivery_id)))
