"""scripts/restore-drill.sh (docs/DEPLOY.md, "Backups and restore"): a database
dumped while transfers, deposits, stakes, bookings and holds keep arriving through
HTTP restores into a new database, `reservo db migrate` has nothing to apply, and
the ledger balances; a database whose ledger does not balance fails the drill."""

from __future__ import annotations

import asyncio
import os
import shutil
from collections.abc import AsyncIterator
from pathlib import Path

import asyncpg
import httpx
import pytest

from reservo.app import create_app
from reservo.bootstrap import build
from reservo.settings import Settings
from tests.helpers.betting import make_account, make_match, place
from tests.helpers.procs import BIN
from tests.helpers.traffic import Traffic, run_for

ROOT = Path(__file__).resolve().parents[2]
DRILL = ROOT / "scripts" / "restore-drill.sh"
LOOPS = 3


@pytest.fixture(autouse=True)
def _tools() -> None:
    missing = [t for t in ("pg_dump", "pg_restore", "psql") if shutil.which(t) is None]
    if missing:
        pytest.skip(f"SKIPPED LOUDLY: the restore drill needs {', '.join(missing)}")


@pytest.fixture
async def own_client(
    base_settings: Settings, own_database: str
) -> AsyncIterator[httpx.AsyncClient]:
    """The API on a database of the test's own (the drill checks all of it)."""
    container = build(base_settings.with_(database_url=own_database))
    transport = httpx.ASGITransport(app=create_app(container, owns_container=False))
    async with httpx.AsyncClient(transport=transport, base_url="http://reservo.test") as c:
        yield c
    await container.close()


async def drill(source: str, admin_url: str) -> tuple[int, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("RESERVO_")}
    env.update(RESTORE_ADMIN_URL=admin_url, RESERVO=str(BIN))
    proc = await asyncio.create_subprocess_exec(
        str(DRILL),
        source,
        env=env,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.STDOUT,
    )
    out, _ = await asyncio.wait_for(proc.communicate(), timeout=50)
    assert proc.returncode is not None
    return proc.returncode, out.decode()


async def stakes(client: httpx.AsyncClient) -> None:
    """Bets move money to the house sub-accounts (STAKE transfers)."""
    match = await make_match(client)
    for _ in range(4):
        account, owner = await make_account(client, 5_000)
        r = await place(client, account, owner, 700, [(match["id"], "1X2", "HOME")])
        assert r.status_code == 201, r.text


async def test_a_live_dump_restores_migrates_and_balances(
    own_client: httpx.AsyncClient, services: tuple[str, str], own_database: str
) -> None:
    traffic = await Traffic.setup(own_client)
    await stakes(own_client)
    stop = asyncio.Event()
    load = run_for(traffic, LOOPS, stop)
    await asyncio.sleep(0.5)
    try:
        code, out = await drill(own_database, services[0])  # dumped mid-load
    finally:
        stop.set()
        await load
    assert code == 0, out
    assert "migrated: applied 0 migration(s): up to date" in out, out
    assert "ok: restored, migrated, the ledger balances" in out, out
    assert "FAILED" not in out, out
    assert traffic.failures() == [], traffic.failures()[:5]
    assert traffic.succeeded("transfer") > 0
    restored = next(line for line in out.splitlines() if "restored:" in line)
    accounts, transfers = (int(restored.split()[i]) for i in (2, 4))
    assert accounts >= 10 and transfers >= 10, restored
    # The scratch database is dropped again.
    scratch = next(line for line in out.splitlines() if "restoring into" in line).split()[3]
    admin = await asyncpg.connect(services[0])
    try:
        left = await admin.fetchval("SELECT count(*) FROM pg_database WHERE datname = $1", scratch)
    finally:
        await admin.close()
    assert left == 0, scratch


async def test_a_ledger_that_does_not_balance_fails_the_drill(
    own_client: httpx.AsyncClient, services: tuple[str, str], own_database: str
) -> None:
    account, _ = await make_account(own_client, 1_000)
    conn = await asyncpg.connect(own_database)
    try:  # money that no entry explains
        await conn.execute("UPDATE wallet_account SET balance = balance + 1 WHERE id = $1", account)
    finally:
        await conn.close()
    code, out = await drill(own_database, services[0])
    assert code == 1, out
    assert "FAILED: 1 currencies whose balances do not sum to 0" in out, out
    assert "FAILED: 1 accounts whose balance is not the sum of their entries" in out, out
    assert "ok: restored" not in out, out
