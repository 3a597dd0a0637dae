"""Delayed jobs: PostgreSQL is the truth, Redis dispatches the next window.

The public facade other modules use: ``Scheduler`` (register, enqueue, dispatch,
cancel) and the ``Job`` value handed to handlers."""

from reservo.scheduler.domain import Job
from reservo.scheduler.service import Config, Handler, Scheduler

__all__ = ["Config", "Handler", "Job", "Scheduler"]
