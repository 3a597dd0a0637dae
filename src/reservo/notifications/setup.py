"""Builds the notifications module from settings and the shared parts: the
consumer of every topic some module renders messages for, its channels, and
the job kind that retries a failed delivery on its own channel."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from datetime import timedelta

from reservo.core.db.database import Queries
from reservo.core.maintenance.retention import PruneRule
from reservo.core.module import Consumes, JobKind, Module, Renderer
from reservo.notifications.channels import Channel, build_channel
from reservo.notifications.consumer import CONSUMER, RETRY_JOB, NotificationConsumer
from reservo.notifications.deliveries import DeliveryRetries, RetryJob
from reservo.notifications.push import PushChannel
from reservo.scheduler import parse_allow
from reservo.settings import Settings
from reservo.shared import Shared

SQL = Queries.load("reservo.notifications")


@dataclass(frozen=True, kw_only=True)
class Notifications(Module):
    consumer: NotificationConsumer
    channels: list[Channel]
    push: PushChannel | None


def setup(shared: Shared, renderers: Mapping[str, Renderer]) -> Notifications:
    """Unlike the other modules' setup, it takes the renderers of every module
    built before it: the topics it consumes are theirs."""
    settings = shared.settings
    channels = channels_from_settings(settings)
    push = push_from_settings(settings)
    consumer = NotificationConsumer(
        shared.db, channels, shared.clock, renderers, push=push, jobs=shared.scheduler
    )
    retries = DeliveryRetries(
        shared.db,
        consumer,
        shared.clock,
        settings.notify_retry_base_s,
        settings.notify_retry_max_s,
    )
    closers = [c.aclose for c in channels] + ([push.aclose] if push else [])
    return Notifications(
        name="notifications",
        consumer=consumer,
        channels=channels,
        push=push,
        consumes=[Consumes(CONSUMER, consumer.topics, consumer.handle, consumer.handle_many)],
        jobs=[JobKind(RETRY_JOB, retries, payload=RetryJob)],
        closers=closers,
        retention=[
            PruneRule(
                "notification_prune",
                "notification",
                SQL.notification_prune,
                timedelta(days=settings.retention_notification_days),
            )
        ],
    )


def channels_from_settings(settings: Settings) -> list[Channel]:
    return [channel_from_settings(settings, kind) for kind in settings.notify_channel.split(",")]


def channel_from_settings(settings: Settings, kind: str) -> Channel:
    return build_channel(
        kind,
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


def push_from_settings(settings: Settings) -> PushChannel | None:
    """Web Push when a VAPID key is set; a bad key, or one without its subject,
    fails here, at start-up."""
    key, subject = settings.push_vapid_private_key, settings.push_vapid_subject
    if not key and not subject:
        return None
    if not key or not subject:
        raise ValueError(
            "RESERVO_PUSH_VAPID_PRIVATE_KEY and RESERVO_PUSH_VAPID_SUBJECT go together"
        )
    return PushChannel(
        key,
        subject,
        parse_allow(settings.jobs_http_allow),
        ttl_s=settings.push_ttl_s,
        timeout_s=settings.notify_timeout_s,
        deadline_s=settings.notify_deadline_s,
    )
