"""Builds the notifications module from settings and the shared parts: the
consumer of every topic some module renders messages for, and its channel."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from datetime import timedelta

from reservo.core.db.database import Queries
from reservo.core.maintenance.retention import PruneRule
from reservo.core.module import Consumes, Module, Renderer
from reservo.notifications.channels import Channel, build_channel
from reservo.notifications.consumer import CONSUMER, NotificationConsumer
from reservo.settings import Settings
from reservo.shared import Shared

SQL = Queries.load("reservo.notifications")


@dataclass(frozen=True, kw_only=True)
class Notifications(Module):
    consumer: NotificationConsumer
    channel: Channel


def setup(shared: Shared, renderers: Mapping[str, Renderer]) -> Notifications:
    """Unlike the other modules' setup, it takes the renderers of every module
    built before it: the topics it consumes are theirs."""
    channel = channel_from_settings(shared.settings)
    consumer = NotificationConsumer(shared.db, channel, shared.clock, renderers)
    aclose = getattr(channel, "aclose", None)
    return Notifications(
        name="notifications",
        consumer=consumer,
        channel=channel,
        consumes=[Consumes(CONSUMER, consumer.topics, consumer.handle, consumer.handle_many)],
        closers=[aclose] if aclose is not None else [],
        retention=[
            PruneRule(
                "notification_prune",
                "notification",
                SQL.notification_prune,
                timedelta(days=shared.settings.retention_notification_days),
            )
        ],
    )


def channel_from_settings(settings: Settings) -> Channel:
    return build_channel(
        settings.notify_channel,
        smtp_host=settings.notify_smtp_host,
        smtp_port=settings.notify_smtp_port,
        smtp_sender=settings.notify_smtp_sender,
        smtp_username=settings.notify_smtp_username,
        smtp_password=settings.notify_smtp_password,
        smtp_starttls=settings.notify_smtp_starttls,
        email_template=settings.notify_email_template,
        http_url=settings.notify_http_url,
        http_token=settings.notify_http_token,
        timeout_s=settings.notify_timeout_s,
        deadline_s=settings.notify_deadline_s,
    )
