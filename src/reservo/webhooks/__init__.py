"""Webhooks out: every module's events, POSTed to the URLs admins subscribe,
signed the Standard Webhooks way, delivered at least once through the
scheduler (category ``webhooks.deliver``).

The public facade: ``Webhooks`` (the service the console shows and acts
through) and the delivery statuses. The composition root builds the module
after the business modules (``setup.setup``), with the event types they declare."""

from reservo.webhooks.domain import DELIVERY_STATUSES, Delivery, Endpoint
from reservo.webhooks.service import Webhooks

__all__ = ["DELIVERY_STATUSES", "Delivery", "Endpoint", "Webhooks"]
