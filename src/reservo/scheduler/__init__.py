"""Delayed jobs: PostgreSQL is the truth, Redis dispatches the next window.

The public facade other modules and the console use: ``Scheduler`` (register,
enqueue, dispatch, cancel; modules enqueue through core's ``JobQueue``
protocol), the ``Job`` value handed to handlers, and the statuses the jobs go
through. Every URL a user stores and the service calls later (Web Push
endpoints, webhooks out) obeys the egress rules of ``http`` jobs: ``egress``;
``resolve_destination`` resolves and checks a URL's addresses,
``HttpHandler.destination`` checks and pins them, ``parse_allow`` reads
RESERVO_JOBS_HTTP_ALLOW, ``static_refusal`` is the check that needs no DNS,
and a handler raises ``JobDeferred`` to be put back without counting an attempt."""

from reservo.scheduler import egress
from reservo.scheduler.config import SchedulerSettings
from reservo.scheduler.domain import (
    CANCELLABLE,
    RETRYABLE,
    STATUSES,
    Job,
    JobDeferred,
    valid_category,
)
from reservo.scheduler.egress import AllowList, parse_allow, static_refusal
from reservo.scheduler.handlers import (
    Destination,
    DestinationRefused,
    HttpHandler,
    resolve_destination,
)
from reservo.scheduler.service import Handler, Scheduler

__all__ = [
    "CANCELLABLE",
    "RETRYABLE",
    "STATUSES",
    "AllowList",
    "Destination",
    "DestinationRefused",
    "Handler",
    "HttpHandler",
    "Job",
    "JobDeferred",
    "Scheduler",
    "SchedulerSettings",
    "egress",
    "parse_allow",
    "resolve_destination",
    "static_refusal",
    "valid_category",
]
