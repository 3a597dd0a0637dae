"""Builds the webhooks module from settings and the shared parts: the endpoints
API, the ``webhooks`` consumer of every declared event, and the
``webhooks.deliver`` job kind the scheduler runs."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from datetime import timedelta

from reservo.core.http import outbound
from reservo.core.maintenance.retention import PruneRule
from reservo.core.module import Consumes, JobKind, Module
from reservo.scheduler import HttpHandler, parse_allow
from reservo.shared import Shared
from reservo.webhooks.api import router
from reservo.webhooks.domain import Retries
from reservo.webhooks.errors import ERRORS
from reservo.webhooks.repo import Q
from reservo.webhooks.sender import Sender
from reservo.webhooks.service import CONSUMER, DELIVER, DeliverJob, Webhooks


@dataclass(frozen=True, kw_only=True)
class WebhooksModule(Module):
    service: Webhooks


def setup(shared: Shared, types: Sequence[str]) -> WebhooksModule:
    """Unlike most modules' setup, it takes the event types every module built
    before it declares: the events it consumes are theirs."""
    s = shared.settings
    own = s.webhooks
    allow = parse_allow(s.jobs_http_allow)
    # The egress rules of `http` jobs; its client sends no proxy and no
    # keep-alive (a pooled connection was checked for another host).
    http = HttpHandler(own.timeout_s, allow, outbound.Limits(own.timeout_s, 4096))
    sender = Sender(http, own.timeout_s, own.per_endpoint)
    service = Webhooks(
        shared.db,
        shared.clock,
        shared.scheduler,
        sender,
        allow,
        types,
        s.kafka_source,
        Retries(own.backoff_base_s, own.backoff_max_s, timedelta(hours=own.retry_hours)),
    )
    keep = timedelta(days=own.retention_days)
    return WebhooksModule(
        name="webhooks",
        service=service,
        routers=[router],
        consumes=[Consumes(CONSUMER, service.types, service.handle, service.handle_many)]
        if service.types
        else [],
        jobs=[JobKind(DELIVER, service.deliver, payload=DeliverJob)],
        errors=ERRORS,
        state={"webhooks": service},
        closers=[http.aclose],
        retention=[
            PruneRule("webhook_delivery_prune", "webhook_delivery", Q.delivery_prune, keep),
            PruneRule("webhook_event_prune", "webhook_event", Q.event_prune, keep),
        ],
    )
