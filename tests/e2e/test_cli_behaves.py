"""The CLI a deploying team meets: a version, one line per unfit setting (exit 2, no
traceback), the effective settings with secrets masked, and the version in
/healthz and /metrics."""

from __future__ import annotations

import os
import subprocess

import httpx
import pytest

from reservo import __version__
from tests.helpers.auth import JWT_SECRET, PAY_SECRET, RESULTS_SECRET
from tests.helpers.procs import BIN

SECRETS = {
    "RESERVO_JWT_SECRET": JWT_SECRET,
    "RESERVO_PAYMENTS_WEBHOOK_SECRET": PAY_SECRET,
    "RESERVO_RESULTS_WEBHOOK_SECRET": RESULTS_SECRET,
}


def _run(*args: str, **env: str) -> subprocess.CompletedProcess[str]:
    clean = {k: v for k, v in os.environ.items() if not k.startswith("RESERVO_")}
    return subprocess.run(
        [str(BIN), *args],
        env={**clean, **env},
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )


def test_version() -> None:
    done = _run("--version")
    assert done.returncode == 0
    assert done.stdout == f"reservo {__version__}\n"


@pytest.mark.parametrize(
    ("command", "env", "message"),
    [
        (["api"], {}, "RESERVO_DATABASE_URL and RESERVO_REDIS_URL must be set"),
        (["api"], {"RESERVO_HTTP_PORT": "eighty"}, "RESERVO_HTTP_PORT: Input should be"),
        (["worker"], {"RESERVO_DB_POOL_MAX": "-"}, "RESERVO_DB_POOL_MAX: Input should be"),
        (
            ["worker"],
            {"RESERVO_RETENTION_INBOX_HOURS": "1"},
            "RESERVO_RETENTION_INBOX_HOURS must exceed RESERVO_RETENTION_OUTBOX_HOURS",
        ),
        (["up"], {"RESERVO_REPLICA_MAX_LAG_S": "0"}, "RESERVO_REPLICA_MAX_LAG_S: Input should be"),
        (
            ["worker"],
            {"RESERVO_REDIS_URL": "redis://127.0.0.1:7001,127.0.0.1:7002/0"},
            "RESERVO_REDIS_URL names several hosts",
        ),
        (["db", "migrate"], {}, "RESERVO_DATABASE_URL is not set"),
        (["verify"], {}, "RESERVO_DATABASE_URL is not set"),
        (["verify", "--replica"], {}, "RESERVO_DATABASE_REPLICA_URLS is not set"),
        (
            ["verify", "--database-url", "postgresql://postgres@127.0.0.1:1/x"],
            {},
            "PostgreSQL is unreachable",
        ),
        (["config"], {"RESERVO_KAFKA_PARTITIONS": "many"}, "RESERVO_KAFKA_PARTITIONS"),
    ],
)
def test_an_unfit_setting_is_one_line_and_exit_2(
    command: list[str], env: dict[str, str], message: str
) -> None:
    done = _run(*command, **SECRETS, **env)
    out = done.stdout + done.stderr
    assert done.returncode == 2, out
    assert [line for line in out.splitlines() if line.strip()] == [out.strip()], out
    assert message in out, out
    assert "Traceback" not in out


def test_config_masks_secrets_and_names_sources() -> None:
    done = _run(
        "config",
        **SECRETS,
        RESERVO_DATABASE_URL="postgresql://app:hunter2-password@db.internal:5432/reservo",
        RESERVO_RENTALS_GATEWAY_TOKEN="gateway-bearer-token-value",
    )
    assert done.returncode == 0, done.stderr
    lines = dict(line.split("=", 1) for line in done.stdout.splitlines())
    assert lines["RESERVO_JWT_SECRET"] == "********  # environment"
    assert lines["RESERVO_RENTALS_GATEWAY_TOKEN"] == "********  # environment"
    assert lines["RESERVO_DATABASE_URL"] == (
        "postgresql://app:***@db.internal:5432/reservo  # environment"
    )
    assert lines["RESERVO_HTTP_PORT"] == "8000  # default"
    for secret in (JWT_SECRET, PAY_SECRET, RESULTS_SECRET, "hunter2", "gateway-bearer"):
        assert secret not in done.stdout


def test_each_server_command_names_what_it_reads() -> None:
    for command in ("api", "worker", "up"):
        done = _run(command, "--help")
        assert "RESERVO_PAYMENTS_WEBHOOK_SECRET" in " ".join(done.stdout.split()), command


async def test_the_version_is_in_healthz_and_metrics(client: httpx.AsyncClient) -> None:
    r = await client.get("/healthz")
    assert r.json() == {"status": "ok", "version": __version__}
    metrics = (await client.get("/metrics")).text
    assert f'reservo_build_info{{version="{__version__}"}} 1.0' in metrics
