"""`reservo verify`: a database with real activity passes every check, and each
corruption made by hand is caught by its own check(s) and no other. One
database with the activity is built per module; each test copies it."""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable
from datetime import timedelta
from pathlib import Path
from urllib.parse import urlsplit, urlunsplit

import asyncpg
import httpx
import pytest
from prometheus_client import REGISTRY

from reservo.app import create_app
from reservo.betting.setup import Betting
from reservo.bootstrap import build, run_workers
from reservo.core.kernel.clock import OffsetClock, SystemClock
from reservo.core_modules import Outbox
from reservo.scheduler import repo as jobs_repo
from reservo.settings import Settings
from reservo.verify import CHECKS, DEFAULT_GRACE_S, Limits, Report, load, verify
from tests.helpers.appointments import book, make_slots
from tests.helpers.auth import ADMIN, auth, new_id
from tests.helpers.betting import (
    kick_off,
    make_account,
    make_match,
    place,
    post_result,
    result_body,
)
from tests.helpers.console import signed_in
from tests.helpers.databases import create_database, drop_database
from tests.helpers.rentals import confirmed_booking
from tests.helpers.replication import started_pair
from tests.helpers.waiting import drain, wait_until

SOON = timedelta(minutes=1)
ALL = {c.name for c in CHECKS}


async def run_checks(url: str) -> Report:
    conn = await asyncpg.connect(url)

    class One:
        async def __aenter__(self) -> asyncpg.Connection:
            return conn

        async def __aexit__(self, *exc: object) -> None:
            return None

    try:
        limits = Limits(grace_s=DEFAULT_GRACE_S, lease_s=17.0)
        return await verify(One, CHECKS, limits, SystemClock().now(), page_size=7)
    finally:
        await conn.close()


def failing(report: Report) -> set[str]:
    return {name for name, n in report.violations().items() if n}


async def _activity(client: httpx.AsyncClient, container: object, clock: OffsetClock) -> None:
    """A little of everything, through the API: bookings (one cancelled), a
    confirmed rental, deposits, a transfer, a pending transfer, bets settled,
    then corrected (reversals, a balance below zero), a job run to completion."""
    _, slots = await make_slots(client, capacity=2)
    p1, p2, p3 = new_id(), new_id(), new_id()
    assert (await book(client, slots[0]["id"], p1)).status_code == 201
    assert (await book(client, slots[0]["id"], p2)).status_code == 201
    third = await book(client, slots[1]["id"], p3)
    assert third.status_code == 201
    r = await client.delete(f"/api/appointments/{third.json()['id']}", headers=auth("patient", p3))
    assert r.status_code in (200, 204), r.text
    await confirmed_booking(client, clock, 30)

    a, a_owner = await make_account(client, 1_000)
    b, _ = await make_account(client, 100)
    keyed = {**auth("bettor", a_owner), "Idempotency-Key": str(uuid.uuid4())}
    r = await client.post(
        "/api/transfers", json={"fromAccountId": a, "toAccountId": b, "amount": 50}, headers=keyed
    )
    assert r.status_code == 201, r.text
    keyed = {**auth("bettor", a_owner), "Idempotency-Key": str(uuid.uuid4())}
    body = {"fromAccountId": a, "toAccountId": b, "amount": 30, "pending": True, "timeoutS": 3600}
    r = await client.post("/api/transfers", json=body, headers=keyed)
    assert r.status_code == 201, r.text

    m = await make_match(client, SOON)
    winner, w_owner = await make_account(client, 100)
    loser, l_owner = await make_account(client, 100)
    assert (
        await place(client, winner, w_owner, 100, [(m["id"], "1X2", "HOME")])
    ).status_code == 201
    assert (await place(client, loser, l_owner, 100, [(m["id"], "1X2", "AWAY")])).status_code == 201
    kick_off(clock, m)
    await post_result(client, result_body(m["externalId"], 2, 1), clock)
    betting = container.module(Betting)  # type: ignore[attr-defined]
    relay = container.module(Outbox).relay  # type: ignore[attr-defined]
    await drain(betting.resender, relay)
    # The winner spends the payout, then a correction takes it back (below zero).
    keyed = {**auth("bettor", w_owner), "Idempotency-Key": str(uuid.uuid4())}
    body = {"fromAccountId": winner, "toAccountId": b, "amount": 150}
    assert (await client.post("/api/transfers", json=body, headers=keyed)).status_code == 201
    resettle = {"result": {"status": "FINISHED", "homeScore": 0, "awayScore": 1}}
    r = await client.post(f"/api/matches/{m['id']}/resettle", json=resettle, headers=ADMIN)
    assert r.status_code == 202, r.text
    await drain(betting.resender, relay)
    await betting.resettlement.wait()
    await drain(relay)


async def _run_a_job(url: str) -> None:
    """A reminder job claimed and completed by the scheduler's own statements."""
    conn = await asyncpg.connect(url)
    try:
        job_id = await conn.fetchval("SELECT min(id) FROM scheduled_job")
        now = await conn.fetchval("SELECT run_at FROM scheduled_job WHERE id = $1", job_id)
        [job] = await jobs_repo.claim(conn, [job_id], now, "w-test", now)
        await jobs_repo.complete(conn, [job.id], [job.revision], now, "w-test")
    finally:
        await conn.close()


@pytest.fixture(scope="module")
async def active_template(
    services: tuple[str, str], migrated_template: str, base_settings: Settings
) -> AsyncIterator[str]:
    url = await create_database(services[0], "reservo_verify_tpl", template=migrated_template)
    clock = OffsetClock()
    container = build(base_settings.with_(database_url=url, verify_interval_s=0), clock)
    app = create_app(container, owns_container=False)
    try:
        async with httpx.AsyncClient(
            transport=httpx.ASGITransport(app=app), base_url="http://reservo.test"
        ) as client:
            await _activity(client, container, clock)
    finally:
        await container.close()
    await _run_a_job(url)
    yield url.rpartition("/")[2]
    await drop_database(services[0], url)


@pytest.fixture
async def active_db(services: tuple[str, str], active_template: str) -> AsyncIterator[str]:
    url = await create_database(services[0], "reservo_verify", template=active_template)
    yield url
    await drop_database(services[0], url)


async def test_a_database_with_real_activity_passes_every_check(active_db: str) -> None:
    conn = await asyncpg.connect(active_db)
    try:  # the activity reached every table a check reads
        for table in (
            "appointment",
            "booking",
            "wallet_entry",
            "wallet_pending_transfer",
            "betting_bet",
            "outbox",
            "job_execution",
            "idempotency_key",
        ):
            assert await conn.fetchval(f"SELECT count(*) FROM {table}") > 0, table
        assert await conn.fetchval("SELECT count(*) FROM wallet_entry WHERE kind = 'REVERSAL'")
        assert await conn.fetchval(
            "SELECT count(*) FROM wallet_account WHERE kind = 'CUSTOMER' AND balance < 0"
        )
    finally:
        await conn.close()
    report = await run_checks(active_db)
    assert failing(report) == set(), report.as_json()
    # Every check read rows (the outbox's reads only PENDING events and the
    # settled ones missing their mark, through partial indexes: none here).
    empty = {name for name, o in report.outcomes.items() if o.rows == 0}
    assert empty == {"outbox_relay"}, report.as_json()


# Each corruption, made by hand as a bug or an operator could, and the checks
# that must catch it: its own and no other (none: a state the module allows,
# which looks like one).
Corrupt = Callable[[asyncpg.Connection], Awaitable[None]]


async def ledger_row_deleted(c: asyncpg.Connection) -> None:
    await c.execute("SET session_replication_role = replica")
    await c.execute(
        "DELETE FROM wallet_entry WHERE id = (SELECT min(id) FROM wallet_entry"
        " WHERE kind = 'TRANSFER')"
    )


async def balance_drift(c: asyncpg.Connection) -> None:
    await c.execute(
        "UPDATE wallet_account SET balance = balance + 1 WHERE id = (SELECT min(id)"
        " FROM wallet_account WHERE kind = 'CUSTOMER')"
    )


async def pending_debits_drift(c: asyncpg.Connection) -> None:
    await c.execute(
        "UPDATE wallet_account SET pending_debits = pending_debits + 1 WHERE id ="
        " (SELECT from_account_id FROM wallet_pending_transfer LIMIT 1)"
    )


async def appointment_past_capacity(c: asyncpg.Connection) -> None:
    # A third BOOKED appointment in the full slot (capacity 2), its counter untouched.
    await c.execute(
        """INSERT INTO appointment (slot_id, patient_id, status, period, created_at)
           SELECT s.id, 987654321, 'BOOKED', tstzrange(s.start_at, s.end_at), now()
             FROM time_slot s WHERE s.booked_count = s.capacity ORDER BY s.id LIMIT 1"""
    )


async def overlapping_rental(c: asyncpg.Connection) -> None:
    await c.execute("ALTER TABLE booking DROP CONSTRAINT ex_car_period")
    await c.execute(
        """INSERT INTO booking (car_id, customer_id, period, return_at, status,
                                deposit_amount, created_at, updated_at)
           SELECT car_id, customer_id + 1, period, return_at, 'CONFIRMED', deposit_amount,
                  now(), now()
             FROM booking WHERE status = 'CONFIRMED' LIMIT 1"""
    )


async def bet_paid_twice(c: asyncpg.Connection) -> None:
    # A second credit of a bet's current generation, as a REFUND next to its
    # PAYOUT, with both entries and both balances: the ledger stays balanced.
    row = await c.fetchrow(
        """SELECT b.id, b.account_id, b.payout, b.generation,
                  (SELECT min(id) FROM wallet_account WHERE kind = 'HOUSE') AS house
             FROM betting_bet b WHERE b.status = 'WON' ORDER BY b.id LIMIT 1"""
    )
    ref = f"bet:{row['id']}" if row["generation"] == 1 else f"bet:{row['id']}:g{row['generation']}"
    async with c.transaction():
        t = await c.fetchval(
            """INSERT INTO wallet_transfer (kind, reference, from_account_id, to_account_id,
                                            amount, created_at)
               VALUES ('REFUND', $1, $2, $3, $4, now()) RETURNING id""",
            ref,
            row["house"],
            row["account_id"],
            row["payout"],
        )
        for account, amount in ((row["house"], -row["payout"]), (row["account_id"], row["payout"])):
            after = await c.fetchval(
                "UPDATE wallet_account SET balance = balance + $2 WHERE id = $1 RETURNING balance",
                account,
                amount,
            )
            await c.execute(
                """INSERT INTO wallet_entry (account_id, transfer_id, amount, balance_after,
                                             kind, reference, created_at)
                   VALUES ($1, $2, $3, $4, 'REFUND', $5, now())""",
                account,
                t,
                amount,
                after,
                ref,
            )


async def _unpay_a_winner(c: asyncpg.Connection) -> str:
    """A WON bet's credit taken out of the ledger with both its entries and both
    balances (the ledger stays balanced); returns the credit's reference."""
    t = await c.fetchrow(
        """SELECT t.id, t.reference, t.from_account_id, t.to_account_id, t.amount
             FROM betting_bet b JOIN wallet_transfer t ON t.to_account_id = b.account_id
              AND t.kind = 'PAYOUT' AND t.reference = 'bet:' || b.id || ':g' || b.generation
            WHERE b.status = 'WON' ORDER BY b.id LIMIT 1"""
    )
    async with c.transaction():
        await c.execute("DELETE FROM wallet_entry WHERE transfer_id = $1", t["id"])
        await c.execute("DELETE FROM wallet_transfer WHERE id = $1", t["id"])
        await c.execute(
            "UPDATE wallet_account SET balance = balance + $2 WHERE id = $1",
            t["from_account_id"],
            t["amount"],
        )
        await c.execute(
            "UPDATE wallet_account SET balance = balance - $2 WHERE id = $1",
            t["to_account_id"],
            t["amount"],
        )
    return str(t["reference"])


async def bet_unpaid(c: asyncpg.Connection) -> None:
    await _unpay_a_winner(c)


async def bet_credit_on_its_way(c: asyncpg.Connection) -> None:
    # Unpaid, but its credit waits in the outbox (the settlement deferred it to
    # the wallet's consumer): not missing.
    reference = await _unpay_a_winner(c)
    payload = json.dumps({"shard": 0, "items": [{"kind": "PAYOUT", "reference": reference}]})
    await c.execute(
        """INSERT INTO outbox (event_id, topic, key, payload, created_at, available_at)
           VALUES (gen_random_uuid(), 'wallet.account.payouts-requested.v1', 'payouts-0',
                   $1::jsonb, now(), now())""",
        payload,
    )


async def idempotency_points_nowhere(c: asyncpg.Connection) -> None:
    # The cancelled appointment (nothing counts it) deleted under its stored answer.
    await c.execute("SET session_replication_role = replica")
    await c.execute(
        "DELETE FROM appointment WHERE id = (SELECT min(id) FROM appointment"
        " WHERE status = 'CANCELLED')"
    )


async def booking_gone(c: asyncpg.Connection) -> None:
    # A booking (its answer names it "bookingId") deleted under its stored answer.
    await c.execute("SET session_replication_role = replica")
    await c.execute("DELETE FROM booking WHERE id = (SELECT min(id) FROM booking)")


async def outbox_stuck(c: asyncpg.Connection) -> None:
    await c.execute(
        """INSERT INTO outbox (event_id, topic, key, payload, created_at, available_at)
           VALUES (gen_random_uuid(), 'verify.test.v1', 'k-stuck', '{}',
                   now() - interval '1 hour', now() - interval '1 hour')"""
    )


async def outbox_behind_a_failed_one(c: asyncpg.Connection) -> None:
    # Old and never tried, but its key's earlier event failed and waits for its
    # retry: the relay keeps a key in order, so this one waits for a reason.
    await c.execute(
        """INSERT INTO outbox (event_id, topic, key, payload, created_at, available_at,
                               attempts, last_error)
           VALUES (gen_random_uuid(), 'verify.test.v1', 'k-held', '{}',
                   now() - interval '2 hours', now() + interval '1 minute', 3, 'broker down')"""
    )
    await c.execute(
        """INSERT INTO outbox (event_id, topic, key, payload, created_at, available_at)
           VALUES (gen_random_uuid(), 'verify.test.v1', 'k-held', '{}',
                   now() - interval '1 hour', now() - interval '1 hour')"""
    )


async def job_run_twice(c: asyncpg.Connection) -> None:
    await c.execute(
        """INSERT INTO job_execution (job_id, attempt, worker, started_at, finished_at, outcome)
           SELECT job_id, attempt + 1, 'w-again', now(), now(), 'DONE'
             FROM job_execution WHERE outcome = 'DONE' LIMIT 1"""
    )


async def job_lost_lease(c: asyncpg.Connection) -> None:
    await c.execute(
        """UPDATE scheduled_job SET status = 'RUNNING', worker = 'w-gone',
                  heartbeat_at = now() - interval '1 hour', started_at = now() - interval '1 hour'
            WHERE id = (SELECT max(id) FROM scheduled_job WHERE status = 'SCHEDULED')"""
    )


CORRUPTIONS: list[tuple[Corrupt, set[str]]] = [
    # A missing entry breaks both promises of the ledger: its account's sum and
    # its transfer's pair.
    (ledger_row_deleted, {"wallet_balance", "wallet_transfer_entries"}),
    (balance_drift, {"wallet_balance"}),
    (pending_debits_drift, {"wallet_available"}),
    (appointment_past_capacity, {"slot_capacity"}),
    (overlapping_rental, {"rental_overlap"}),
    (bet_paid_twice, {"bet_payouts"}),
    (bet_unpaid, {"bet_payouts"}),
    (bet_credit_on_its_way, set()),
    (idempotency_points_nowhere, {"idempotency_resource"}),
    (booking_gone, {"idempotency_resource"}),
    (outbox_stuck, {"outbox_relay"}),
    (outbox_behind_a_failed_one, set()),
    (job_run_twice, {"job_run_once"}),
    (job_lost_lease, {"job_lease"}),
]


@pytest.mark.parametrize(
    ("corrupt", "caught_by"), CORRUPTIONS, ids=lambda x: getattr(x, "__name__", "")
)
async def test_each_corruption_is_caught_by_its_own_check(
    active_db: str, corrupt: Corrupt, caught_by: set[str]
) -> None:
    conn = await asyncpg.connect(active_db)
    try:
        await corrupt(conn)
    finally:
        await conn.close()
    report = await run_checks(active_db)
    assert failing(report) == caught_by, report.as_json()
    for name in caught_by:  # each finding names its rows
        for f in report.outcomes[name].findings:
            assert f.subject and f.ids, f


def _cli(url: str | None, *args: str, **settings: str) -> subprocess.CompletedProcess[str]:
    """`reservo verify` on ``url`` (None: where ``settings``, RESERVO_* variables, say)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("RESERVO_")}
    env["PYTHONPATH"] = os.pathsep.join(
        [str(Path(__file__).parents[2] / "src"), env.get("PYTHONPATH", "")]
    )
    env.update(settings)
    where = ["--database-url", url] if url else []
    return subprocess.run(
        [sys.executable, "-m", "reservo.cli", "verify", *where, *args],
        capture_output=True,
        text=True,
        env=env,
        timeout=120,
        check=False,
    )


async def test_the_command_exits_0_then_1_with_json_naming_the_rows(active_db: str) -> None:
    ok = await asyncio.to_thread(_cli, active_db, "--json")
    assert ok.returncode == 0, ok.stderr
    assert ok.stderr == ""  # no progress display when stderr is no terminal
    doc = json.loads(ok.stdout)
    assert doc["ok"] is True and doc["violations"] == 0
    assert [c["check"] for c in doc["checks"]] == [c.name for c in CHECKS]
    conn = await asyncpg.connect(active_db)
    try:
        await outbox_stuck(conn)
        await balance_drift(conn)
    finally:
        await conn.close()
    bad = await asyncio.to_thread(_cli, active_db, "--json")
    assert bad.returncode == 1, bad.stderr
    doc = json.loads(bad.stdout)
    assert doc["ok"] is False and doc["violations"] == 2
    by_check = {c["check"]: c for c in doc["checks"]}
    assert set(by_check["outbox_relay"]) >= {"rowsChecked", "violations", "findings", "truncated"}
    [finding] = by_check["wallet_balance"]["findings"]
    assert finding["subject"].startswith("wallet_account ") and finding["ids"]
    assert set(finding["facts"]) >= {"balance", "sumOfEntries"}
    table = await asyncio.to_thread(_cli, active_db, "--check", "wallet_balance")
    assert table.returncode == 1 and "wallet_account" in table.stdout, table.stdout
    unknown = await asyncio.to_thread(_cli, active_db, "--check", "nope")
    assert unknown.returncode == 2 and "nope" in unknown.stderr


async def test_an_ha_url_of_several_hosts_asking_for_the_primary_is_read(active_db: str) -> None:
    """The URL an HA deployment gives (several hosts, target_session_attrs=
    read-write, the first host silent): verify reaches the primary and stays
    read-only. A read-only start-up setting made every host look like a standby."""
    parts = urlsplit(active_db)
    silent = "127.0.0.1:9"  # discard port: refused at once, as a lost host's may be
    hosts = f"{silent},{parts.hostname}:{parts.port or 5432}"
    url = urlunsplit(
        parts._replace(netloc=f"{parts.username}@{hosts}", query="target_session_attrs=read-write")
    )
    done = await asyncio.to_thread(_cli, url, "--json", "--check", "wallet_balance")
    assert done.returncode == 0, done.stdout + done.stderr
    assert json.loads(done.stdout)["ok"] is True


async def test_on_a_hot_standby_it_reads_what_the_primary_wrote() -> None:
    """--replica: the first of RESERVO_DATABASE_REPLICA_URLS, a real streaming
    standby (read-only: every page's transaction is one a standby accepts)."""
    async with started_pair("reservo-verify-") as pair:
        primary = await asyncpg.connect(pair.primary_url)
        try:
            await outbox_stuck(primary)
        finally:
            await primary.close()
        await pair.caught_up()
        replica = {"RESERVO_DATABASE_REPLICA_URLS": pair.standby_url}
        done = await asyncio.to_thread(_cli, None, "--replica", "--json", **replica)
    assert done.returncode == 1, done.stderr
    doc = json.loads(done.stdout)
    assert {c["check"]: c["violations"] for c in doc["checks"] if c["violations"]} == {
        "outbox_relay": 1
    }


def _on_a_terminal(url: str) -> tuple[int, str]:
    """The command with its stderr on a pseudo-terminal: (exit code, what it drew)."""
    import pty

    parent, child = pty.openpty()
    env = {k: v for k, v in os.environ.items() if not k.startswith("RESERVO_")}
    proc = subprocess.Popen(
        [sys.executable, "-m", "reservo.cli", "verify", "--json", "--database-url", url],
        stdout=subprocess.DEVNULL,
        stderr=child,
        env={**env, "TERM": "xterm", "COLUMNS": "120"},
    )
    os.close(child)
    drawn = b""
    while True:
        try:
            chunk = os.read(parent, 65536)
        except OSError:  # the terminal closed with the process
            break
        if not chunk:
            break
        drawn += chunk
    os.close(parent)
    return proc.wait(timeout=120), drawn.decode(errors="replace")


async def test_on_a_terminal_the_command_draws_its_progress(active_db: str) -> None:
    code, drawn = await asyncio.to_thread(_on_a_terminal, active_db)
    assert code == 0
    assert "bet_payouts" in drawn and "rows" in drawn, drawn


def _gauge(check: str) -> float | None:
    return REGISTRY.get_sample_value("reservo_invariant_violations", {"check": check})


async def test_the_maintenance_role_runs_it_and_exports_the_gauge(
    active_db: str, base_settings: Settings
) -> None:
    conn = await asyncpg.connect(active_db)
    try:
        await outbox_stuck(conn)
    finally:
        await conn.close()
    settings = base_settings.with_(
        database_url=active_db,
        verify_interval_s=3600,
        redis_namespace=f"test-verify-{uuid.uuid4().hex[:8]}",
    )
    container = build(settings, OffsetClock())
    stop = asyncio.Event()
    task = asyncio.create_task(run_workers(container, ["maintenance"], stop))
    try:
        await wait_until(lambda: _gauge("outbox_relay") == 1.0, 30, "the gauge")
        assert _gauge("wallet_balance") == 0.0
        status = await load(container.gate, settings.redis_namespace)
        assert status is not None and status.violations["outbox_relay"] == 1
        app = create_app(container, owns_container=False)
        async with httpx.AsyncClient(
            transport=httpx.ASGITransport(app=app), base_url="http://reservo.test"
        ) as client:
            await signed_in(client)
            r = await client.get("/console/overview/panels")
            assert r.status_code == 200
            assert "Invariants broken" in r.text and "outbox_relay" in r.text
    finally:
        stop.set()
        await task
        await container.close()
