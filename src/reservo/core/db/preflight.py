"""What a command checks of its database before it starts, and how a database
that stops it is said: one line naming ``RESERVO_DATABASE_URL`` and what to fix
(the CLI prints it and exits 2), never a traceback, never the password.

``reservo db migrate`` and ``reservo up`` cannot do their work without the
database: unreachable, refusing the credentials, missing, or a migration that
fails are refusals. ``reservo api`` and ``reservo worker`` start while the
database is away (requests answer 503, the roles retry, until it is back), but
not on a database that refuses them or whose schema lacks a migration of this
release: those do not mend by waiting."""

from __future__ import annotations

import socket
from urllib.parse import unquote, urlsplit

import asyncpg

from reservo.core.db.migrate import Migration, MigrationFailed, available

SETTING = "RESERVO_DATABASE_URL"


class StartRefused(Exception):
    """A database that stops the start; ``str()`` is the line to print."""


def _where(dsn: str) -> str:
    """``user@host:port/database`` of the URL, without its password."""
    parts = urlsplit(dsn)
    user = unquote(parts.username or "") or "(default user)"
    hosts = parts.netloc.rpartition("@")[2]  # every host of a multi-host URL
    if "," not in hosts:
        hosts = f"{parts.hostname or 'localhost'}:{parts.port or 5432}"
    database = unquote(parts.path.lstrip("/")) or user
    return f"{user}@{hosts}/{database}"


def refusal(dsn: str, exc: BaseException) -> StartRefused | None:
    """The one-line refusal a failed connection or migration means, or None for
    an error that is no configuration problem (a bug: it keeps its traceback)."""
    where = _where(dsn)
    if isinstance(exc, MigrationFailed):
        return StartRefused(
            f"{SETTING} ({where}): migration {exc.migration.version:04d}_{exc.migration.name} "
            f"failed: {_first_line(exc.__cause__ or exc)}; nothing of it was applied"
        )
    if isinstance(
        exc, asyncpg.InvalidPasswordError | asyncpg.InvalidAuthorizationSpecificationError
    ):
        return StartRefused(
            f"{SETTING} ({where}): PostgreSQL refused the credentials: {_first_line(exc)}"
        )
    if isinstance(exc, asyncpg.InvalidCatalogNameError):
        return StartRefused(
            f"{SETTING} ({where}): {_first_line(exc)}; create it, or name an existing one"
        )
    if isinstance(exc, socket.gaierror):
        return StartRefused(f"{SETTING} ({where}): the host name does not resolve ({exc})")
    if isinstance(exc, OSError | TimeoutError | asyncpg.CannotConnectNowError):
        return StartRefused(
            f"{SETTING} ({where}): PostgreSQL is unreachable ({_first_line(exc)}); "
            "is it running, and are the host and port right?"
        )
    return None


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip() or type(exc).__name__
    return text.splitlines()[0]


async def pending(dsn: str, timeout_s: float) -> list[Migration]:
    """This release's migrations the database has not applied (all of them on a
    database never migrated). Raises what connecting raised."""
    conn = await asyncpg.connect(dsn, timeout=timeout_s)
    try:
        try:
            rows = await conn.fetch("SELECT version FROM schema_migrations")
        except asyncpg.UndefinedTableError:
            rows = []
    finally:
        await conn.close()
    done = {r["version"] for r in rows}
    return [m for m in available() if m.version not in done]


async def check_schema(dsn: str, timeout_s: float) -> bool:
    """Before ``reservo api`` or ``worker`` starts: raises StartRefused when the
    database refuses the credentials, does not exist, or lacks a migration of
    this release. Returns False when it is unreachable (the process starts and
    waits for it), True when it is ready."""
    try:
        missing = await pending(dsn, timeout_s)
    except (OSError, TimeoutError, asyncpg.CannotConnectNowError):
        return False
    except Exception as exc:
        refused = refusal(dsn, exc)
        if refused is None:
            raise
        raise refused from None
    if missing:
        names = ", ".join(f"{m.version:04d}_{m.name}" for m in missing[:3])
        if len(missing) > 3:
            names += ", ..."
        raise StartRefused(
            f"{SETTING} ({_where(dsn)}): {len(missing)} migration(s) of this release are not "
            f"applied ({names}): run `reservo db migrate` first"
        )
    return True
