"""Kafka fixtures: one embedded Tansu broker per session, and a database of our own
(a Kafka relay publishes every pending outbox row; other tests' rows must stay
with their local-transport relays)."""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import AsyncIterator, Coroutine, Iterator
from pathlib import Path
from typing import Any

import asyncpg
import pytest

from reservo.core.clock import OffsetClock
from reservo.core.db import Database
from reservo.core.embedded import EmbeddedKafka
from reservo.core.migrate import migrate

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
async def kafka_database_url(services: tuple[str, str]) -> AsyncIterator[str]:
    admin_url = services[0]
    name = f"reservo_kafka_{uuid.uuid4().hex[:12]}"
    conn = await asyncpg.connect(admin_url)
    await conn.execute(f'CREATE DATABASE "{name}"')
    await conn.close()
    url = f"{admin_url.rpartition('/')[0]}/{name}"
    await migrate(url)
    conn = await asyncpg.connect(url)
    await conn.execute(EFFECT_TABLE)
    await conn.close()
    yield url
    conn = await asyncpg.connect(admin_url)
    await conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
    await conn.close()


@pytest.fixture
async def kdb(kafka_database_url: str) -> AsyncIterator[Database]:
    db = Database(kafka_database_url, min_size=1, max_size=20)
    yield db
    await db.close()


@pytest.fixture
def kclock() -> OffsetClock:
    return OffsetClock()


class Background:
    """Background workers of one test, stopped (and awaited) even when the test fails."""

    def __init__(self) -> None:
        self.stop = asyncio.Event()
        self.tasks: list[asyncio.Task[None]] = []

    def start(self, work: Coroutine[Any, Any, None]) -> asyncio.Task[None]:
        task = asyncio.create_task(work)
        self.tasks.append(task)
        return task


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


def unique_topic(name: str) -> str:
    return f"test.{name}{uuid.uuid4().hex[:8]}.v1"
