"""How outbox events reach their consumers: in-process (local) or Kafka."""

from reservo.core.messaging.transport.base import Event, Handler, Subscriptions, Transport

__all__ = ["Event", "Handler", "Subscriptions", "Transport"]
