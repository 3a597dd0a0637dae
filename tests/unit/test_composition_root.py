"""The composition root builds the graph without dialling anything, so what it
wires is checked here: the job queue it is given, the setups it is told to use
instead, the retention rules each module declares, and that importing the CLI
builds no graph."""

from __future__ import annotations

import subprocess
import sys
from typing import Any

import pytest

from reservo.betting.setup import Betting
from reservo.bootstrap import MODULES, build, declared_retention
from reservo.core.db.database import Database
from reservo.core.kernel.clock import Clock
from reservo.core.module import Module
from reservo.core.redis.client import make_client
from reservo.core_modules import Outbox
from reservo.notifications.setup import Notifications
from reservo.ops.setup import Ops
from reservo.scheduler import Scheduler, SchedulerSettings
from reservo.scheduler.setup import SchedulerModule
from reservo.settings import Settings
from reservo.shared import Shared

PLACEHOLDER = "composition-root-test-secret-0123456789-"
SETTINGS = Settings(
    database_url="postgresql://composition-root.invalid/reservo",
    redis_url="redis://composition-root.invalid:6379/0",
    jwt_secret=PLACEHOLDER + "jwt",
    payments_webhook_secret=PLACEHOLDER + "payments",
    results_webhook_secret=PLACEHOLDER + "results",
)


class RecordingQueue(Scheduler):
    """A real scheduler that remembers the order categories were registered in."""

    def __init__(self, *args: Any) -> None:
        super().__init__(*args)
        self.registered: list[str] = []

    def register(self, category: str, *args: Any, **kw: Any) -> None:
        self.registered.append(category)
        super().register(category, *args, **kw)


def test_build_uses_the_job_queue_it_is_given_and_registers_every_job_kind_in_it() -> None:
    made: list[RecordingQueue] = []

    def queue(settings: Settings, db: Database, clock: Clock) -> RecordingQueue:
        client = make_client(settings.redis_url or "", 1.0)
        made.append(RecordingQueue(db, clock, client, "composition-root", SchedulerSettings()))
        return made[0]

    c = build(SETTINGS, queue=queue, announce=False)
    assert c.scheduler is made[0]
    declared = [job.category for m in c.modules for job in m.jobs]
    assert made[0].registered == declared
    assert {"http", "appointments.reminder", "rentals.expire-hold"} <= set(declared)
    # The scheduler module runs the queue the root built, not one of its own.
    assert c.module(SchedulerModule).service is made[0]


def test_build_uses_the_setups_it_is_given_by_module_package() -> None:
    def bare(shared: Shared) -> Module:
        return Module(name="ops")

    c = build(SETTINGS, setups={"reservo.ops": bare}, announce=False)
    with pytest.raises(LookupError):
        c.module(Ops)
    # Webhooks out come after the modules whose events they subscribe to.
    assert [m.name for m in c.modules][-len(MODULES) - 1 :] == [
        "appointments",
        "rentals",
        "wallet",
        "betting",
        "scheduler",
        "ops",
        "console",
        "verify",
        "webhooks",
    ]
    with pytest.raises(ValueError, match=r"no module \['reservo\.nowhere'\] to replace"):
        build(SETTINGS, setups={"reservo.nowhere": bare}, announce=False)


def test_each_module_declares_the_retention_of_its_own_tables() -> None:
    c = build(SETTINGS, announce=False)
    tables = {m.name: {rule.table for rule in m.retention} for m in c.modules if m.retention}
    assert tables == {
        "outbox": {"idempotency_key", "outbox", "inbox", "dead_letter"},
        "notifications": {"notification"},
        "betting": {"webhook_events_fallback", "webhook_events_rejected"},
        "scheduler": {"scheduled_job"},
        "webhooks": {"webhook_delivery", "webhook_event"},
    }
    assert c.module(Outbox).retention and c.module(Notifications).retention
    assert {r.name for r in c.module(Betting).retention} == {"fallback_prune", "rejected_prune"}
    # The settings reach the rules: what the maintenance role runs.
    kept = {r.name: r.keep for r in declared_retention(SETTINGS.with_(retention_job_days=3))}
    assert kept["job_prune_finished"].days == 3
    assert set(kept) == {
        "idem_prune",
        "outbox_prune",
        "inbox_prune",
        "dead_letter_prune",
        "notification_prune",
        "fallback_prune",
        "rejected_prune",
        "job_prune_finished",
        "job_prune_dead",
        "webhook_delivery_prune",
        "webhook_event_prune",
    }


def test_importing_the_cli_builds_no_graph() -> None:
    probe = "import reservo.cli, reservo.bootstrap as b; print(b._declared.cache_info().currsize)"
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "0", out.stderr
