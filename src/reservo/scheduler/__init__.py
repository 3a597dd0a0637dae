"""Delayed jobs: PostgreSQL is the truth, Redis dispatches the next window.

The public facade other modules and the console use: ``Scheduler`` (register,
enqueue, dispatch, cancel; modules enqueue through core's ``JobQueue``
protocol), the ``Job`` value handed to handlers, and the statuses the jobs go
through."""

from reservo.scheduler.config import SchedulerSettings
from reservo.scheduler.domain import CANCELLABLE, RETRYABLE, STATUSES, Job, valid_category
from reservo.scheduler.service import Handler, Scheduler

__all__ = [
    "CANCELLABLE",
    "RETRYABLE",
    "STATUSES",
    "Handler",
    "Job",
    "Scheduler",
    "SchedulerSettings",
    "valid_category",
]
