"""Fixtures of the acceptance suite: reservo deployed from its installed entry point,
configured by environment variables alone, on a database of its own (and a Redis
namespace of its own, or a private redis-server the test may flush)."""

from __future__ import annotations

import asyncio
import sys
import uuid
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

from tests.helpers.databases import create_database, drop_database
from tests.helpers.deployment import SECRETS, Deploy, Deployment, Layout
from tests.helpers.scheduler import drop_namespace


@pytest.fixture(scope="module")
async def deploy(
    services: tuple[str, str], tmp_path_factory: pytest.TempPathFactory
) -> AsyncIterator[Deploy]:
    """``await deploy(layout, demo=..., redis_url=..., database_url=..., **env)``: a
    started Deployment on a fresh database (unless ``database_url`` is given) and a
    fresh namespace of the session's Redis (unless ``redis_url`` is given); extra
    keyword arguments are RESERVO_* variables (``http_header_timeout_s="2"``).
    Every one is stopped, its database dropped, its namespace deleted at the end
    of the module."""
    admin_url, shared_redis = services
    made: list[Deployment] = []
    databases: list[str] = []
    namespaces: list[str] = []

    async def make(
        layout: Layout,
        *,
        demo: bool = False,
        redis_url: str | None = None,
        database_url: str | None = None,
        **settings: Any,
    ) -> Deployment:
        if database_url is None:
            database_url = await create_database(admin_url, "reservo_accept")
            databases.append(database_url)
        namespace = f"accept-{uuid.uuid4().hex[:8]}"
        if redis_url is None:
            redis_url = shared_redis
            namespaces.append(namespace)
        env = {
            "RESERVO_DATABASE_URL": database_url,
            "RESERVO_REDIS_URL": redis_url,
            "RESERVO_REDIS_NAMESPACE": namespace,
            "RESERVO_LOG_LEVEL": "WARNING",
            # Stop at once on SIGTERM: no balancer routes to these processes (the
            # drain has its own test, tests/e2e/test_graceful_stop.py).
            "RESERVO_HTTP_DRAIN_S": "0",
            **({} if demo else SECRETS),
            **{f"RESERVO_{name.upper()}": str(value) for name, value in settings.items()},
        }
        cwd = tmp_path_factory.mktemp(f"deployment-{layout}")
        # The README's commands put the checkout's .venv/bin on PATH.
        (cwd / ".venv").symlink_to(Path(sys.executable).parent.parent)
        deployment = Deployment(layout, env, cwd, demo=demo)
        made.append(deployment)
        await asyncio.to_thread(deployment.start)
        return deployment

    yield make
    for deployment in made:
        await asyncio.to_thread(deployment.stop)
    for url in databases:
        await drop_database(admin_url, url)
    for namespace in namespaces:
        await drop_namespace(shared_redis, namespace)
