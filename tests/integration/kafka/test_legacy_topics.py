"""RESERVO_KAFKA_LEGACY_TOPICS: reservo's consumer groups read the topics of the
events' 0.2.0 names (creating them on a broker that creates topics on demand,
as the embedded one does) only while it is on; `reservo up --demo` turns it off."""

from __future__ import annotations

import uuid

from aiokafka.admin import AIOKafkaAdminClient

from reservo.core.db.database import Database
from reservo.core.kernel.clock import OffsetClock
from reservo.core.kernel.contract import EventRegistry, EventSpec
from reservo.demo import settings_for_demo
from reservo.settings import Settings
from tests.helpers.kafka import Background, effect_handler, runner
from tests.helpers.waiting import wait_until


def _event(tag: str) -> tuple[EventRegistry, str, str, str]:
    """A registry of one event that had another name (and so topic) before."""
    name, stream, old = f"test.legacy{tag}.happened.v1", f"test.legacy{tag}.v1", f"test.old{tag}.v1"
    registry = EventRegistry()
    spec = EventSpec(name, stream, "test", "k", "k", {}, {}, formerly=(old,))
    registry.add([spec])
    return registry, name, stream, old


async def _topics(bootstrap: str) -> set[str]:
    admin = AIOKafkaAdminClient(bootstrap_servers=bootstrap, request_timeout_ms=5000)
    await admin.start()
    try:
        return set(await admin.list_topics())
    finally:
        await admin.close()


async def test_former_topics_are_read_only_while_legacy_topics_is_on(
    kafka_bootstrap: str, kdb: Database, kclock: OffsetClock, background: Background
) -> None:
    runs = {}
    for legacy in (True, False):
        registry, name, stream, old = _event(uuid.uuid4().hex[:8])
        consumer = f"legacy-{uuid.uuid4().hex[:6]}"
        run = runner(
            kafka_bootstrap,
            consumer,
            {name: effect_handler(kdb, consumer)},
            kdb,
            kclock,
            events=registry,
            legacy_topics=legacy,
        )
        assert run.topics() == ([stream, old] if legacy else [stream])
        background.start(run.run(background.stop))
        runs[legacy] = (run, stream, old)
    for run, _, _ in runs.values():
        await wait_until(run.assigned.is_set, 30, "the group's partitions")

    topics = await _topics(kafka_bootstrap)
    _, stream_on, old_on = runs[True]
    _, stream_off, old_off = runs[False]
    assert {stream_on, old_on, stream_off} <= topics  # on: the old topic is read (made)
    assert old_off not in topics  # off: never asked for, never made


def test_the_demo_turns_legacy_topics_off_unless_set(base_settings: Settings) -> None:
    assert base_settings.kafka_legacy_topics is True  # a deployment's default: upgrades read them
    assert settings_for_demo(base_settings).kafka_legacy_topics is False
    chosen = base_settings.with_(kafka_legacy_topics=True)
    assert settings_for_demo(chosen).kafka_legacy_topics is True
