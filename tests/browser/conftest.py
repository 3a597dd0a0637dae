"""The console's browser tests: the real app served by uvicorn on a free port
(real PostgreSQL and Redis, lifespan on, so the pulse samples as in production)
and Debian's headless Chromium driven by Playwright (never a downloaded browser).

When no Chromium is installed the tests are skipped with a loud reason;
`.ci/run` and `make test` install it (scripts/install-browser.sh)."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import pytest

from reservo.settings import Settings
from tests.helpers.browser import Live, chromium_path, serve


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
