"""Databases of a test's own: created fresh, migrated fully or up to a given migration."""

from __future__ import annotations

import shutil
import sys
import uuid
from collections.abc import Awaitable, Callable
from importlib import resources
from pathlib import Path

import asyncpg

from reservo.core.db.migrate import available, migrate

# The ``database_at`` fixture (tests/conftest.py): ``await database_at(n)`` is the URL
# of a database of the test's own migrated up to migration ``n``.
DatabaseAt = Callable[[int], Awaitable[str]]


def url_of(admin_url: str, name: str) -> str:
    """``admin_url`` pointing at database ``name`` instead."""
    return f"{admin_url.rpartition('/')[0]}/{name}"


async def create_database(admin_url: str, prefix: str, template: str | None = None) -> str:
    """A new empty database (or a copy of ``template``, which nobody may be connected
    to), named ``prefix`` and a random suffix; its URL."""
    name = f"{prefix}_{uuid.uuid4().hex[:12]}"
    copy = f' TEMPLATE "{template}"' if template else ""
    conn = await asyncpg.connect(admin_url)
    try:
        await conn.execute(f'CREATE DATABASE "{name}"{copy}')
    finally:
        await conn.close()
    return url_of(admin_url, name)


async def drop_database(admin_url: str, url: str) -> None:
    """Drops the database of ``url``, whoever is still connected to it."""
    name = url.rpartition("/")[2]
    conn = await asyncpg.connect(admin_url)
    try:
        await conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
    finally:
        await conn.close()


async def migrate_up_to(url: str, version: int, scratch: Path) -> None:
    """Apply the migrations numbered up to ``version`` (inclusive; numbers have gaps) with the real
    migrator, as a release that shipped only those did: a later ``migrate(url)``
    applies the rest. The migrator reads a package, so those files are copied into
    one of their own under ``scratch``."""
    last = available()[-1].version
    if not 0 < version < last:
        raise ValueError(f"migrations 1-{last - 1} leave some to apply, not {version}")
    package = f"migrations_up_to_{version:04d}_{uuid.uuid4().hex[:8]}"
    target = scratch / package
    target.mkdir(parents=True)
    (target / "__init__.py").write_text("")
    for entry in resources.files("reservo.migrations").iterdir():
        if entry.name[:4].isdigit() and int(entry.name[:4]) <= version:
            with resources.as_file(entry) as path:
                shutil.copy(path, target / entry.name)
    sys.path.insert(0, str(scratch))
    try:
        await migrate(url, package)
    finally:
        sys.path.remove(str(scratch))
        sys.modules.pop(package, None)
