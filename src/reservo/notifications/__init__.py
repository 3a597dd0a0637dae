"""Notifications: the messages the modules' events become (the renderers each
module declares in ``Module.notifications``), sent once per (message,
recipient) on every channel the recipient has, and the addresses they go to.

The public facade: ``contacts``, a user's own e-mail, phone and Web Push
subscriptions, which a module records in its own transaction (appointments: a
patient's), ``subscriptions``, the rules a push subscription must meet, and the
consumer's type. The composition root builds the module last (``setup.setup``), with the
renderers of every other module."""

from reservo.notifications import contacts, subscriptions
from reservo.notifications.consumer import NotificationConsumer

__all__ = ["NotificationConsumer", "contacts", "subscriptions"]
