"""What a module's events become for people: the messages a renderer returns
(``Module.notifications``). Sending them is the notifications module's
(reservo/notifications): its consumer fills in the recipients' addresses and
hands each message to the configured channel."""

from __future__ import annotations

from typing import NamedTuple


class Notification(NamedTuple):
    """A tuple, not a frozen dataclass: a settlement chunk renders thousands, and
    a tuple is built several times faster."""

    recipient_user_id: int
    subject: str
    body: str
    event_id: str  # the outbox event id, used as an idempotency key downstream
    # The recipient's own addresses (notifications.contacts), filled in by the consumer at
    # send time; None: the channel's default (e-mail template, or the user id).
    email: str | None = None
    phone: str | None = None
