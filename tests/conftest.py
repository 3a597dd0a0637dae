"""Shared fixtures: a real PostgreSQL and a real Redis for the whole session.

Uses RESERVO_TEST_DATABASE_URL / RESERVO_TEST_REDIS_URL when set, otherwise
starts the embedded ones. Each session gets its own fresh database and its own
Redis key namespace, so runs on one machine never see each other's data.

Tests marked ``redis_cluster`` run twice: on that Redis and on a Redis Cluster
(three masters, three replicas) the session starts on first use; or on the
cluster a node of which RESERVO_TEST_REDIS_CLUSTER names (``redis://...``);
RESERVO_TEST_REDIS_CLUSTER=0 skips the cluster runs."""

from __future__ import annotations

import os
import uuid
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import asyncpg
import httpx
import pytest

from reservo.app import create_app
from reservo.bootstrap import Container, build
from reservo.core.db.migrate import migrate
from reservo.core.kernel.clock import OffsetClock
from reservo.settings import Settings
from tests.helpers.auth import JWT_SECRET, PAY_SECRET, RESULTS_SECRET
from tests.helpers.databases import DatabaseAt, create_database, drop_database, migrate_up_to
from tests.helpers.openapi_audit import ProblemAudit
from tests.redis_cluster import LocalCluster, RedisTarget

CLUSTER_ENV = "RESERVO_TEST_REDIS_CLUSTER"


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    """A test marked ``redis_cluster`` that reaches Redis through ``redis_target``
    (``redis_url``, ``base_settings``, ``container``...) runs on both kinds."""
    if "redis_target" not in metafunc.fixturenames:
        return
    if metafunc.definition.get_closest_marker("redis_cluster") is None:
        return
    cluster: Any = "cluster"
    if os.environ.get(CLUSTER_ENV) == "0":
        cluster = pytest.param("cluster", marks=pytest.mark.skip(reason=f"{CLUSTER_ENV}=0"))
    metafunc.parametrize("redis_target", ["standalone", cluster], indirect=True, scope="session")


@pytest.fixture(scope="session")
def services(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[str, str]]:
    pg_url = os.environ.get("RESERVO_TEST_DATABASE_URL")
    redis_url = os.environ.get("RESERVO_TEST_REDIS_URL")
    stack: list[Any] = []
    root = Path(tmp_path_factory.mktemp("embedded"))
    if not pg_url:
        from reservo.core.embedded import EmbeddedPostgres

        pg = EmbeddedPostgres(root)
        pg_url = pg.start()
        stack.append(pg)
    if not redis_url:
        from reservo.core.embedded import EmbeddedRedis

        rd = EmbeddedRedis(root)
        redis_url = rd.start()
        stack.append(rd)
    yield pg_url, redis_url
    for svc in reversed(stack):
        svc.stop()


@pytest.fixture(scope="session")
async def database_url(services: tuple[str, str]) -> AsyncIterator[str]:
    """A fresh, migrated database for this test session, dropped afterwards."""
    url = await create_database(services[0], "reservo_test")
    await migrate(url)
    yield url
    await drop_database(services[0], url)


@pytest.fixture(scope="session")
async def migrated_template(services: tuple[str, str]) -> AsyncIterator[str]:
    """A migrated database nobody connects to: ``own_database`` copies it, which
    takes a fraction of running every migration again."""
    url = await create_database(services[0], "reservo_template")
    await migrate(url)
    yield url.rpartition("/")[2]
    await drop_database(services[0], url)


@pytest.fixture
async def own_database(services: tuple[str, str], migrated_template: str) -> AsyncIterator[str]:
    """The URL of a fresh, fully migrated database of the test's own, dropped
    afterwards: for tests whose workers process every pending row they can see
    (their counts must not include other tests' rows) or that change the schema."""
    url = await create_database(services[0], "reservo_own", template=migrated_template)
    yield url
    await drop_database(services[0], url)


@pytest.fixture
async def database_at(services: tuple[str, str], tmp_path: Path) -> AsyncIterator[DatabaseAt]:
    """``await database_at(n)``: the URL of a database of the test's own migrated up
    to migration ``n`` inclusive (0: empty, not even the migrations table), as a
    release that shipped only those left it; ``migrate(url)`` applies the rest.
    Every one is dropped after the test."""
    made: list[str] = []

    async def at(version: int) -> str:
        url = await create_database(services[0], f"reservo_at{version:04d}")
        made.append(url)
        if version:
            await migrate_up_to(url, version, tmp_path / f"migrations-{len(made)}")
        return url

    yield at
    for url in made:
        await drop_database(services[0], url)


@pytest.fixture(scope="session")
def redis_cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RedisTarget]:
    """A Redis Cluster for the whole session, started on first use."""
    given = os.environ.get(CLUSTER_ENV, "")
    if given == "0":
        pytest.skip(f"{CLUSTER_ENV}=0")
    if given.startswith(("redis://", "rediss://")):
        yield RedisTarget(given, cluster=True)
        return
    with LocalCluster(Path(tmp_path_factory.mktemp("redis-cluster"))) as cluster:
        yield cluster.target


@pytest.fixture(scope="session")
def redis_target(request: pytest.FixtureRequest, services: tuple[str, str]) -> RedisTarget:
    """The single Redis, or (the ``cluster`` run of a ``redis_cluster`` test) the cluster."""
    if getattr(request, "param", "standalone") == "cluster":
        cluster: RedisTarget = request.getfixturevalue("redis_cluster")
        return cluster
    return RedisTarget(services[1])


@pytest.fixture(scope="session")
def redis_url(redis_target: RedisTarget) -> str:
    return redis_target.url


@pytest.fixture(scope="session")
def base_settings(database_url: str, redis_target: RedisTarget) -> Settings:
    return Settings(
        database_url=database_url,
        redis_url=redis_target.url,
        redis_cluster=redis_target.cluster,
        jwt_secret=JWT_SECRET,
        payments_webhook_secret=PAY_SECRET,
        results_webhook_secret=RESULTS_SECRET,
        # Never a default: the suite pays holds on the sandbox page and executes
        # refunds, so it chooses the sandbox gateway explicitly.
        rentals_payment_gateway="sandbox",
        redis_namespace=f"test-{uuid.uuid4().hex[:8]}",
        db_pool_max=30,
        outbox_poll_interval_s=0.05,
        outbox_backoff_base_s=0.05,
        outbox_backoff_max_s=0.5,
        log_json=False,
    )


@pytest.fixture
def clock() -> OffsetClock:
    return OffsetClock()


@pytest.fixture
async def container(base_settings: Settings, clock: OffsetClock) -> AsyncIterator[Container]:
    c = build(base_settings, clock)
    yield c
    await c.close()


@pytest.fixture
async def client(container: Container) -> AsyncIterator[httpx.AsyncClient]:
    app = create_app(container, owns_container=False)
    transport = httpx.ASGITransport(app=app)
    # Every problem answered must be one the OpenAPI document lists for that operation.
    hooks = {"response": [ProblemAudit(app)]}
    async with httpx.AsyncClient(
        transport=transport, base_url="http://reservo.test", event_hooks=hooks
    ) as c:
        yield c


@pytest.fixture
async def db(database_url: str) -> AsyncIterator[asyncpg.Connection]:
    conn = await asyncpg.connect(database_url)
    yield conn
    await conn.close()
