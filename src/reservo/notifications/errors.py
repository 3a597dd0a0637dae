"""The one failure every channel raises for a delivery to retry."""


class NotificationError(Exception):
    """Delivery failed; the caller should retry later."""
