"""The console's browser tests: the real app served by uvicorn on a free port
(real PostgreSQL and Redis, lifespan on, so the pulse samples as in production)
and Debian's headless Chromium driven by Playwright (never a downloaded browser).

When no Chromium is installed the tests are skipped with a loud reason;
`.ci/run` and `make test` install it (scripts/install-browser.sh)."""

from __future__ import annotations

import asyncio
import os
import shutil
import socket
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Any

import httpx
import pytest
import uvicorn

from reservo.app import create_app
from reservo.bootstrap import Container, build
from reservo.core.clock import OffsetClock
from reservo.settings import Settings

CHROMIUM_CANDIDATES = ("chromium", "chromium-browser")


def chromium_path() -> str | None:
    explicit = os.environ.get("RESERVO_TEST_CHROMIUM")
    if explicit:
        return explicit
    for name in CHROMIUM_CANDIDATES:
        found = shutil.which(name)
        if found:
            return found
    return None


@dataclass
class Live:
    url: str
    container: Container
    http: httpx.AsyncClient  # to the live server, no cookies kept
    doctors: list[int] = field(default_factory=list)  # the demo's, when loaded


async def serve(settings: Settings) -> AsyncIterator[Live]:
    container = build(settings, OffsetClock())
    app = create_app(container)
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind(("127.0.0.1", 0))
    port = sock.getsockname()[1]
    server = uvicorn.Server(uvicorn.Config(app, log_config=None, access_log=False, lifespan="on"))
    task = asyncio.create_task(server.serve(sockets=[sock]))
    while not server.started:
        if task.done():
            task.result()
        await asyncio.sleep(0.02)
    url = f"http://127.0.0.1:{port}"
    async with httpx.AsyncClient(base_url=url, follow_redirects=False, timeout=10) as http:
        yield Live(url, container, http)
    server.should_exit = True
    await task
    sock.close()


@pytest.fixture
async def live(base_settings: Settings) -> AsyncIterator[Live]:
    async for running in serve(base_settings):
        yield running


@pytest.fixture(scope="session")
async def browser() -> AsyncIterator[Any]:
    path = chromium_path()
    if path is None:
        pytest.skip(
            "!!! NO CHROMIUM INSTALLED: the console's browser tests did NOT run. "
            "Install Debian's `chromium` (scripts/install-browser.sh) !!!"
        )
    from playwright.async_api import async_playwright

    async with async_playwright() as pw:
        # --no-sandbox: CI runs as root, where Chromium's sandbox refuses to start.
        b = await pw.chromium.launch(executable_path=path, args=["--no-sandbox"])
        yield b
        await b.close()


@pytest.fixture
async def page(browser: Any) -> AsyncIterator[Any]:
    context = await browser.new_context(viewport={"width": 1280, "height": 900})
    p = await context.new_page()
    p.set_default_timeout(15_000)
    yield p
    await context.close()
