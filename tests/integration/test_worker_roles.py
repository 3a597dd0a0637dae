"""The roles a worker process runs are derived from the subscriptions: `reservo up`
and `reservo worker --roles all` run every consumer any module subscribed, the
help lists them, and an unknown role is a clear error."""

from __future__ import annotations

import asyncio
import os
import re
import subprocess
import uuid
from datetime import UTC, datetime, timedelta

import asyncpg
import httpx
import pytest
from typer.testing import CliRunner

from reservo import cli
from reservo.app import create_app
from reservo.bootstrap import (
    ALL,
    Container,
    build,
    declared_background_roles,
    declared_consumers,
    run_workers,
)
from reservo.core.kernel.clock import OffsetClock
from reservo.rentals.setup import Rentals
from reservo.settings import Settings
from tests.helpers.auth import JWT_SECRET, new_id
from tests.helpers.betting import (
    kick_off,
    make_account,
    make_match,
    place,
    post_result,
    result_body,
)
from tests.helpers.procs import BIN, env_for


def test_up_runs_every_subscribed_consumer(container: Container) -> None:
    consumers = container.subscriptions.consumers()
    # Every module that consumes events is there (a list kept by hand once named only one).
    assert {"betting.settlement", "wallet.payouts", "rentals-refunds", "notifications"} <= set(
        consumers
    )
    up = container.resolve_roles(cli.UP_ROLES)
    assert set(consumers) <= set(up)
    assert set(declared_background_roles()) <= set(up)
    assert up == container.all_roles() == container.resolve_roles([ALL])
    # `--roles all` mixed with explicit names adds nothing twice.
    assert container.resolve_roles(["relay", ALL, "wallet.payouts"]) == [
        "relay",
        *[r for r in container.all_roles() if r != "relay"],
    ]


def test_help_lists_the_consumers_the_modules_subscribe(container: Container) -> None:
    assert list(declared_consumers()) == container.consumer_roles()
    out = CliRunner().invoke(cli.app, ["worker", "--help"], env={"COLUMNS": "400"}).output
    for role in [ALL, *container.all_roles()]:
        assert role in out, out


def test_unknown_role_is_a_clear_error(container: Container, base_settings: Settings) -> None:
    with pytest.raises(ValueError, match=r"unknown role\(s\) bogus; known: all, .*wallet\.payouts"):
        container.resolve_roles(["relay", "bogus"])
    # A real process: the command configures logging for the whole interpreter.
    result = subprocess.run(
        [str(BIN), "worker", "--roles", "relay,bogus"],
        env=env_for(base_settings, COLUMNS="400"),
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == 2, result.stderr
    assert "unknown role(s) bogus" in result.stderr
    assert "betting.settlement" in result.stderr


def test_token_prints_only_the_token() -> None:
    """`ADMIN=$(reservo token ...)` must capture a token and nothing else, with no
    gateway configured (the start-up warnings belong to servers, not to --help)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("RESERVO_")}
    env["RESERVO_JWT_SECRET"] = JWT_SECRET
    result = subprocess.run(
        [str(BIN), "token", "--role", "admin", "--sub", "1"],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == 0, result.stderr
    assert re.fullmatch(r"[\w-]+\.[\w-]+\.[\w-]+\n", result.stdout), result.stdout
    assert result.stderr == ""


async def test_up_roles_without_kafka_settle_pay_and_refund(
    base_settings: Settings, own_database: str
) -> None:
    """The local transport: the relay runs every subscription in-process and the
    resender hands results to settlement, so `up`'s roles lose nothing either."""
    own = {  # its scheduler role must not meet other tests' job ids in Redis
        "database_url": own_database,
        "redis_namespace": f"{base_settings.redis_namespace}-roles-{uuid.uuid4().hex[:6]}",
    }
    clock = OffsetClock()
    c = build(base_settings.with_(**own), clock)
    stop = asyncio.Event()
    workers = asyncio.create_task(run_workers(c, cli.UP_ROLES, stop))
    db = await asyncpg.connect(own_database)
    try:
        async with httpx.AsyncClient(
            transport=httpx.ASGITransport(app=create_app(c, owns_container=False)),
            base_url="http://reservo.test",
        ) as client:
            match = await make_match(client, timedelta(minutes=5))
            account, owner = await make_account(client, 1_000)
            r = await place(client, account, owner, 200, [(match["id"], "TOTALS_2_5", "OVER")])
            assert r.status_code == 201, r.text
            kick_off(clock, match)  # a final result is refused before the match starts
            r = await post_result(client, result_body(match["externalId"], 3, 2), clock)
            assert r.status_code == 202, r.text
        # Rentals: a paid booking cancelled 100 h before pickup (full refund).
        car = await c.module(Rentals).service.create_car(
            f"T-{uuid.uuid4().hex[:8]}", "Uno", "Porto", 10_000, 7
        )
        start = (datetime.now(UTC) + timedelta(hours=100)).replace(second=0, microsecond=0)
        booking = await c.module(Rentals).service.hold(
            car.id, new_id(), start, start + timedelta(days=1)
        )
        paid = await c.module(Rentals).service.on_payment(
            booking.id, f"txn-{uuid.uuid4().hex}", booking.deposit_amount, "SUCCEEDED"
        )
        assert paid == "confirmed"
        cancelled = await c.module(Rentals).service.cancel(booking.id, "customer")
        assert cancelled.refund_amount == booking.deposit_amount > 0
        for sql, args, want in [
            ("SELECT settlement_status FROM betting_match WHERE id = $1", [match["id"]], "SETTLED"),
            ("SELECT balance FROM wallet_account WHERE id = $1", [account], 800 + 390),
            (
                "SELECT amount FROM payment WHERE booking_id = $1 AND type = 'REFUND'",
                [booking.id],
                booking.deposit_amount,
            ),
        ]:
            for _ in range(300):
                if await db.fetchval(sql, *args) == want:
                    break
                await asyncio.sleep(0.1)
            assert await db.fetchval(sql, *args) == want, sql
    finally:
        stop.set()
        await asyncio.wait_for(workers, 30)
        await db.close()
        await c.close()
