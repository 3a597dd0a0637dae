"""The systemd units of deploy/systemd (docs/DEPLOY.md): each one runs a real
`reservo` command that the CLI parses, every worker role the code declares runs
in some unit, every unit carries the hardening and the environment file, and
`systemd-analyze verify` (where the machine has it) finds nothing to say."""

from __future__ import annotations

import shlex
import shutil
import subprocess
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
import typer
import typer.core

from reservo.bootstrap import declared_background_roles, declared_consumers
from reservo.cli import app
from reservo.settings import Settings, env_name
from tests.helpers.procs import BIN

ROOT = Path(__file__).resolve().parents[2]
UNITS = ROOT / "deploy" / "systemd"
ENV_EXAMPLE = ROOT / "deploy" / "reservo.env.example"
INSTALLED = "/opt/reservo/current/bin/reservo"
ENV_FILE = "/etc/reservo/reservo.env"
# What every long-running unit and the release step must say (the rest of the
# hardening is systemd-analyze's business).
HARDENING = {
    "User": "reservo",
    "NoNewPrivileges": "yes",
    "ProtectSystem": "strict",
    "ProtectHome": "yes",
    "PrivateTmp": "yes",
    "CapabilityBoundingSet": "",
}


@dataclass
class Unit:
    """A unit file as systemd reads it: sections of keys, each key possibly repeated."""

    name: str
    sections: dict[str, dict[str, list[str]]] = field(default_factory=dict)

    def get(self, section: str, key: str) -> list[str]:
        return self.sections.get(section, {}).get(key, [])

    def one(self, section: str, key: str) -> str:
        values = self.get(section, key)
        assert len(values) == 1, f"{self.name}: [{section}] {key} = {values}"
        return values[0]


def read_unit(path: Path) -> Unit:
    """configparser cannot keep repeated keys (SystemCallFilter=, Environment=)."""
    unit = Unit(path.name)
    section: dict[str, list[str]] | None = None
    for raw in path.read_text().splitlines():
        line = raw.strip()
        if not line or line.startswith(("#", ";")):
            continue
        if line.startswith("[") and line.endswith("]"):
            section = unit.sections.setdefault(line[1:-1], {})
            continue
        assert section is not None, f"{path.name}: {line!r} outside a section"
        key, sep, value = line.partition("=")
        assert sep, f"{path.name}: {line!r} is not key=value"
        section.setdefault(key.strip(), []).append(value.strip())
    return unit


def units() -> list[Unit]:
    found = [read_unit(p) for p in sorted(UNITS.glob("*.service"))]
    assert found, f"no units in {UNITS}"
    return found


def environment(unit: Unit) -> dict[str, str]:
    pairs = (item.split("=", 1) for e in unit.get("Service", "Environment") for item in e.split())
    return dict(pairs)


def command_line(unit: Unit) -> list[str]:
    """ExecStart's arguments after the reservo binary, ${VAR} from the unit's defaults."""
    argv = shlex.split(unit.one("Service", "ExecStart"))
    assert argv[0] == INSTALLED, f"{unit.name} runs {argv[0]}, not {INSTALLED}"
    defaults = environment(unit)
    return [defaults.get(a[2:-1], a) if a.startswith("${") else a for a in argv[1:]]


def parse(args: list[str]) -> tuple[str, dict[str, Any]]:
    """The reservo command these arguments name and its parsed options, as the CLI
    would read them (an unknown command, option or bad value raises)."""
    cmd = typer.main.get_command(app)
    path: list[str] = []
    while isinstance(cmd, typer.core.TyperGroup):
        assert args, f"`reservo {' '.join(path)}` needs a command"
        sub = cmd.get_command(typer.Context(cmd), args[0])
        assert sub is not None, f"no command `reservo {' '.join([*path, args[0]])}`"
        path.append(args.pop(0))
        cmd = sub
    ctx = cmd.make_context(" ".join(path), list(args))
    return " ".join(path), dict(ctx.params)


def worker_roles(unit: Unit) -> list[str]:
    command, params = parse(command_line(unit))
    assert command == "worker", unit.name
    return [r.strip() for r in str(params["roles"]).split(",")]


def test_every_unit_runs_a_real_reservo_command() -> None:
    commands = {}
    for unit in units():
        command, params = parse(command_line(unit))
        commands[unit.name] = command
        if command == "api":
            assert params["workers"] >= 1, unit.name
    assert commands["reservo-api.service"] == "api"
    assert commands["reservo-migrate.service"] == "db migrate"
    assert {n for n, c in commands.items() if c == "worker"}, "no worker unit"


def test_worker_units_name_declared_roles_and_cover_them_all() -> None:
    declared = {*declared_background_roles(), *declared_consumers()}
    placed: dict[str, str] = {}
    for unit in units():
        if parse(command_line(unit))[0] != "worker":
            continue
        roles = worker_roles(unit)
        unknown = set(roles) - declared
        assert not unknown, f"{unit.name} runs roles the code does not declare: {unknown}"
        for role in roles:
            assert role not in placed, f"{role} in both {placed[role]} and {unit.name}"
            placed[role] = unit.name
    # A role the code gains without a unit would never run in a deployment.
    assert set(placed) == declared, f"no unit runs {declared - set(placed)}"
    consumers_unit = {placed[c] for c in declared_consumers()}
    assert consumers_unit == {"reservo-worker-consumers.service"}, consumers_unit


def test_units_are_hardened_and_read_the_environment_file() -> None:
    for unit in units():
        assert unit.one("Service", "EnvironmentFile") == ENV_FILE, unit.name
        for key, value in HARDENING.items():
            assert unit.one("Service", key) == value, f"{unit.name}: {key}"
        assert unit.get("Unit", "Description"), unit.name
        if unit.name == "reservo-migrate.service":
            assert unit.one("Service", "Type") == "oneshot"
            assert not unit.get("Install", "WantedBy"), "the release step is started by hand"
        else:
            assert unit.one("Service", "Restart") == "on-failure", unit.name
            assert "reservo-migrate.service" in unit.one("Unit", "After"), unit.name
            assert unit.one("Install", "WantedBy") == "multi-user.target", unit.name


def test_the_environment_example_names_only_real_settings() -> None:
    known = {env_name(name) for name in Settings().flat()}
    named = [
        line.lstrip("#").split("=", 1)[0].strip()
        for line in ENV_EXAMPLE.read_text().splitlines()
        if line.lstrip("#").startswith("RESERVO_")
    ]
    assert named
    assert set(named) <= known, set(named) - known
    for secret in (
        "RESERVO_JWT_SECRET",
        "RESERVO_PAYMENTS_WEBHOOK_SECRET",
        "RESERVO_RESULTS_WEBHOOK_SECRET",
    ):
        assert secret in named


def test_systemd_analyze_verify_finds_nothing(tmp_path: Path) -> None:
    """The real binary and the example environment file stand in for the
    installed paths (verify checks that ExecStart is executable)."""
    analyze = shutil.which("systemd-analyze")
    if analyze is None:
        pytest.skip("SKIPPED LOUDLY: systemd-analyze is not installed; the units are parsed only")
    for path in UNITS.glob("*.service"):
        text = path.read_text().replace(INSTALLED, str(BIN)).replace(ENV_FILE, str(ENV_EXAMPLE))
        (tmp_path / path.name).write_text(text)
    done = subprocess.run(
        [analyze, "verify", *sorted(str(p) for p in tmp_path.glob("*.service"))],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    out = (done.stdout + done.stderr).strip()
    assert done.returncode == 0, out
    assert out == "", out
