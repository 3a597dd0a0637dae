"""The roles a worker process runs are derived from the subscriptions: `reservo up`
and `reservo worker --roles all` run every consumer any module subscribed, the
help lists them, and an unknown role is a clear error."""

from __future__ import annotations

import subprocess

import pytest
from typer.testing import CliRunner

from reservo import cli
from reservo.bootstrap import ALL, BACKGROUND_ROLES, Container, declared_consumers
from reservo.settings import Settings
from tests.e2e.procs import BIN, env_for


def test_up_runs_every_subscribed_consumer(container: Container) -> None:
    consumers = container.subscriptions.consumers()
    # Every module that consumes events is there (a list kept by hand once named only one).
    assert {"betting.settlement", "wallet.payouts", "rentals-refunds", "notifications"} <= set(
        consumers
    )
    up = container.resolve_roles(cli.UP_ROLES)
    assert set(consumers) <= set(up)
    assert set(BACKGROUND_ROLES) <= set(up)
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
