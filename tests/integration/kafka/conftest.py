"""Kafka fixtures: one embedded Tansu broker per session, and a database of our own
(a Kafka relay publishes every pending outbox row; other tests' rows must stay
with their local-transport relays)."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import asyncpg
import pytest

from reservo.core.db.database import Database
from reservo.core.embedded import EmbeddedKafka
from reservo.core.kernel.clock import OffsetClock
from tests.helpers.databases import create_database, drop_database
from tests.helpers.kafka import Background

EFFECT_TABLE = """
CREATE TABLE kafka_test_effect (
    id       bigserial PRIMARY KEY,
    consumer text NOT NULL,
    event_id uuid NOT NULL,
    key      text,
    seq      integer
)"""


@pytest.fixture(scope="session")
def kafka_bootstrap(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    broker = EmbeddedKafka(Path(tmp_path_factory.mktemp("kafka")))
    yield broker.start()
    broker.stop()


@pytest.fixture(scope="session")
async def kafka_database_url(
    services: tuple[str, str], migrated_template: str
) -> AsyncIterator[str]:
    url = await create_database(services[0], "reservo_kafka", template=migrated_template)
    conn = await asyncpg.connect(url)
    await conn.execute(EFFECT_TABLE)
    await conn.close()
    yield url
    await drop_database(services[0], url)


@pytest.fixture
async def kdb(kafka_database_url: str) -> AsyncIterator[Database]:
    db = Database(kafka_database_url, min_size=1, max_size=20)
    yield db
    await db.close()


@pytest.fixture
def kclock() -> OffsetClock:
    return OffsetClock()


@pytest.fixture
async def background() -> AsyncIterator[Background]:
    bg = Background()
    yield bg
    bg.stop.set()
    done, pending = await asyncio.wait(bg.tasks, timeout=30) if bg.tasks else (set(), set())
    for task in pending:
        task.cancel()
    for task in done:
        if not task.cancelled() and task.exception() is not None:
            raise task.exception()  # type: ignore[misc]
