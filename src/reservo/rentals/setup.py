"""Builds the rentals module from settings and the shared parts."""

from __future__ import annotations

from dataclasses import dataclass

import structlog
from fastapi import APIRouter

from reservo.core.aio.loops import run_every
from reservo.core.module import Consumes, JobKind, Module
from reservo.rentals import events, sandbox
from reservo.rentals.api import HOT_ROUTES, router
from reservo.rentals.errors import CONSTRAINTS, ERRORS
from reservo.rentals.gateway import PaymentGateway, SandboxGateway, WebhookKey, build_gateway
from reservo.rentals.service import EXPIRE_HOLD, ExpireHoldJob, RefundConsumer, RentalService
from reservo.shared import Shared

log = structlog.get_logger(__name__)


@dataclass(frozen=True, kw_only=True)
class Rentals(Module):
    service: RentalService
    refunds: RefundConsumer
    gateway: PaymentGateway | None  # None: none configured (refunds wait)


def setup(shared: Shared) -> Rentals:
    s = shared.settings
    own = s.rentals
    gateway = build_gateway(
        own.payment_gateway,
        s.payments_webhook_secret,
        own.gateway_url,
        own.gateway_token,
        own.gateway_timeout_s,
        page_base=own.payment_url_base or f"http://{s.http_host}:{s.http_port}",
        deadline_s=own.gateway_deadline_s,
    )
    if shared.announce:
        _warn_about_gateway(gateway)
    service = RentalService(
        shared.db,
        shared.clock,
        shared.cache,
        own,
        scheduler=shared.scheduler,  # one expiry job per hold
        gateway=gateway,
        stale=shared.stale,
    )
    refunds = RefundConsumer(shared.db, gateway, shared.clock)
    routers: list[APIRouter] = [router]
    if isinstance(gateway, SandboxGateway):  # chosen explicitly only
        routers.append(sandbox.router)
    return Rentals(
        name="rentals",
        service=service,
        refunds=refunds,
        gateway=gateway,
        routers=routers,
        hot=HOT_ROUTES,
        consumes=[Consumes(events.REFUND_CONSUMER, [events.REFUND_REQUESTED], refunds.handle)],
        jobs=[JobKind(EXPIRE_HOLD, service.expire_job, payload=ExpireHoldJob)],
        # The safety net behind the per-hold expiry jobs.
        roles={
            "rentals": lambda stop: run_every(
                stop, own.sweep_interval_s, "rentals_sweep", service.sweep
            )
        },
        errors=ERRORS,
        constraints=CONSTRAINTS,
        events=events.CONTRACT,
        notifications={topic: events.notifications for topic in events.TOPICS},
        state={
            "rentals": service,
            "rentals_gateway": gateway,
            "rentals_webhook": WebhookKey(s.payments_webhook_secret, s.webhook_tolerance_s),
        },
        closers=[gateway.aclose] if gateway is not None else [],
    )


def _warn_about_gateway(gateway: PaymentGateway | None) -> None:
    """Once per process (build runs once per API or worker process): both are
    fine for a demo and wrong for production, so say so where operators look."""
    if isinstance(gateway, SandboxGateway):
        log.warning(
            "rentals_sandbox_gateway",
            warning="sandbox payment gateway enabled: payments are simulated, "
            "do not use in production",
        )
    elif gateway is None:
        log.warning(
            "rentals_no_gateway",
            warning="no payment gateway configured: set RESERVO_RENTALS_PAYMENT_GATEWAY; "
            "bookings have no paymentUrl and refunds wait until one is set",
        )
