"""Every secret the service trusts must be set, long and private: `reservo api`,
`worker` and `up` refuse to start otherwise (one line naming the setting, exit 2),
and only `reservo up --demo` makes throwaway ones, saying so."""

from __future__ import annotations

import json
import os
import subprocess
import time
from pathlib import Path

import httpx
import orjson
import pytest

from reservo.core.http.auth import sign_webhook
from reservo.settings import Settings, SettingsError, check_secrets, secret_problems
from tests.helpers.auth import JWT_SECRET, PAY_SECRET, RESULTS_SECRET
from tests.helpers.procs import BIN, free_port, running, wait_http

GOOD = {
    "RESERVO_JWT_SECRET": JWT_SECRET,
    "RESERVO_PAYMENTS_WEBHOOK_SECRET": PAY_SECRET,
    "RESERVO_RESULTS_WEBHOOK_SECRET": RESULTS_SECRET,
}
COMMANDS = {
    "api": ["api", "--port", "1"],
    "worker": ["worker", "--roles", "relay"],
    "up": ["up", "--port", "1"],
}


def _env(database_url: str, redis_url: str, tmp: Path, **secrets: str | None) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("RESERVO_")}
    env.update(
        RESERVO_DATABASE_URL=database_url,
        RESERVO_REDIS_URL=redis_url,
        RESERVO_DATA_DIR=str(tmp),
        RESERVO_LOG_LEVEL="WARNING",
    )
    for name, value in {**GOOD, **secrets}.items():
        if value is not None:
            env[name] = value
    return env


def _refused(args: list[str], env: dict[str, str]) -> tuple[int, str]:
    done = subprocess.run([str(BIN), *args], env=env, capture_output=True, timeout=60, check=False)
    return done.returncode, (done.stdout + done.stderr).decode()


# Each way a secret can be unfit, as the one the issue found: a deployment that set
# only RESERVO_JWT_SECRET trusted the public default webhook secrets.
CASES = [
    ({"RESERVO_PAYMENTS_WEBHOOK_SECRET": None}, "RESERVO_PAYMENTS_WEBHOOK_SECRET is not set"),
    ({"RESERVO_RESULTS_WEBHOOK_SECRET": None}, "RESERVO_RESULTS_WEBHOOK_SECRET is not set"),
    ({"RESERVO_JWT_SECRET": None}, "RESERVO_JWT_SECRET is not set"),
    ({"RESERVO_JWT_SECRET": "x" * 31}, "RESERVO_JWT_SECRET is 31 bytes"),
    (
        {"RESERVO_PAYMENTS_WEBHOOK_SECRET": "dev-payments-secret"},
        "RESERVO_PAYMENTS_WEBHOOK_SECRET is a published demo value",
    ),
    (
        {"RESERVO_JWT_SECRET": "dev-secret-change-me-in-production-please"},
        "RESERVO_JWT_SECRET is a published demo value",
    ),
    (
        {"RESERVO_RESULTS_WEBHOOK_SECRET": JWT_SECRET},
        "RESERVO_RESULTS_WEBHOOK_SECRET must differ from RESERVO_JWT_SECRET",
    ),
]


@pytest.mark.parametrize("command", sorted(COMMANDS))
def test_every_server_command_refuses_an_unfit_secret_in_one_line(
    command: str, services: tuple[str, str], tmp_path: Path
) -> None:
    for secrets, message in CASES:
        code, out = _refused(COMMANDS[command], _env(*services, tmp_path, **secrets))
        assert code == 2, (command, secrets, out)
        lines = [line for line in out.splitlines() if line.strip()]
        assert len(lines) == 1, (command, secrets, out)
        assert message in lines[0], (command, secrets, out)
        assert "Traceback" not in out
    # Nothing was started: the embedded servers' folders were never made.
    assert not (tmp_path / "postgres").exists()


def test_the_rule_refuses_what_the_cli_refuses() -> None:
    """The graph itself refuses too, so no entry point can run with a weak secret."""
    base = Settings(
        jwt_secret=JWT_SECRET,
        payments_webhook_secret=PAY_SECRET,
        results_webhook_secret=RESULTS_SECRET,
    )
    assert secret_problems(base) == []
    weak = base.with_(payments_webhook_secret="pay-secret")
    assert secret_problems(weak) == [
        "RESERVO_PAYMENTS_WEBHOOK_SECRET is 10 bytes; at least 32 are required"
    ]
    with pytest.raises(SettingsError, match="openssl rand"):
        check_secrets(weak)
    # Length counts bytes, not characters.
    assert secret_problems(base.with_(jwt_secret="é" * 16)) == []


def test_token_refuses_without_a_secret(tmp_path: Path, services: tuple[str, str]) -> None:
    env = _env(*services, tmp_path, RESERVO_JWT_SECRET=None)
    code, out = _refused(["token", "--role", "admin", "--sub", "1"], env)
    assert code == 2 and "RESERVO_JWT_SECRET is not set" in out and "Traceback" not in out


@pytest.mark.slow
def test_demo_generates_throwaway_secrets_and_says_so(
    own_database: str, services: tuple[str, str], tmp_path: Path
) -> None:
    port = free_port()
    env = _env(
        own_database,
        services[1],
        tmp_path,
        RESERVO_JWT_SECRET=None,
        RESERVO_PAYMENTS_WEBHOOK_SECRET=None,
        RESERVO_RESULTS_WEBHOOK_SECRET=None,
        RESERVO_REDIS_NAMESPACE=f"secrets-demo-{port}",
    )
    log = tmp_path / "up.log"
    with running(["up", "--demo", "--port", str(port)], env, log) as proc:
        base = f"http://127.0.0.1:{port}"
        wait_http(f"{base}/readyz", proc, log, timeout_s=90)
        banner = log.read_text()
        assert "throwaway secrets generated for RESERVO_JWT_SECRET" in banner
        saved = json.loads((tmp_path / "demo-secrets.json").read_text())
        assert (tmp_path / "demo-secrets.json").stat().st_mode & 0o077 == 0
        assert all(len(value.encode()) >= 32 for value in saved.values())
        assert len(set(saved.values())) == 3

        # A payment confirmation forged with the old public default is refused;
        # one signed with the demo's own secret gets past the signature.
        raw = orjson.dumps(
            {"bookingId": 1, "providerTxnId": "forged", "amount": 1, "status": "SUCCEEDED"}
        )
        now = int(time.time())
        for secret, refused in (
            ("dev-payments-secret", True),
            (saved["payments_webhook_secret"], False),
        ):
            r = httpx.post(
                f"{base}/api/payments/webhook",
                content=raw,
                headers={
                    "X-Signature": sign_webhook(secret, raw, now),
                    "Content-Type": "application/json",
                },
            )
            assert (r.status_code == 401) is refused, r.text
            now += 1

        # `reservo token` in the same data folder signs with the demo's secret.
        minted = subprocess.run(
            [str(BIN), "token", "--role", "admin", "--sub", "1"],
            env=env,
            capture_output=True,
            check=True,
            timeout=60,
        )
        assert b"demo's throwaway secret" in minted.stderr
        bearer = minted.stdout.decode().strip()
        r = httpx.get(
            f"{base}/api/jobs?category=http&limit=5", headers={"Authorization": f"Bearer {bearer}"}
        )
        assert r.status_code == 200, r.text
        assert proc.poll() is None
