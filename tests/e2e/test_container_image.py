"""The container image of scripts/image.sh, run as docs/DEPLOY.md runs it: podman,
the host's network, configuration and secrets as environment variables alone.

The image migrates a fresh database of the test's own (`reservo db migrate`), then
serves the API as its non-root user: a doctor and a schedule made as admin, an
appointment booked as a patient, all over HTTP with bearer tokens, and its
HEALTHCHECK passes. `podman stop` (SIGTERM) ends it after the drain window
(RESERVO_HTTP_DRAIN_S) with exit code 0, well before podman's kill deadline.

Building the image (scripts/image.sh build) is a no-op when an image of the
current sources exists; a cold build takes about 3.5 minutes (mmdebstrap 2 of
them, cached afterwards under ~/.cache/reservo-image)."""

from __future__ import annotations

import asyncio
import os
import shutil
import subprocess
import time
import uuid
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path

import asyncpg
import httpx
import pytest

from tests.helpers.appointments import book, make_slots
from tests.helpers.auth import auth, new_id
from tests.helpers.databases import create_database, drop_database
from tests.helpers.deployment import SECRETS
from tests.helpers.procs import free_port

ROOT = Path(__file__).resolve().parents[2]
DRAIN_S = 3.0
# podman's kill deadline: SIGKILL after this many seconds (exit code 137).
STOP_TIMEOUT_S = 20
IMAGE_USER_ID = "10001"

pytestmark = pytest.mark.timeout(900)


@dataclass(frozen=True)
class Image:
    ref: str
    # What podman needs on this machine to start a container (see _runnable):
    # global options (the OCI runtime) and `podman run` options.
    runtime: tuple[str, ...]
    run_flags: tuple[str, ...]


def _podman(
    *args: str, timeout: float = 120, env: dict[str, str] | None = None
) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        ["podman", *args], capture_output=True, text=True, timeout=timeout, check=False, env=env
    )


def _user_namespaces() -> bool:
    try:
        return int(Path("/proc/sys/user/max_user_namespaces").read_text()) > 0
    except (OSError, ValueError):
        return False


def _runnable(ref: str) -> Image:
    """The image with the flags podman needs here, or a skip saying why podman
    cannot run a container. crun refuses a host with cgroup v1 and v2 mounted
    together ("hybrid"), which runc accepts; a VM that forbids raising the process
    limits needs them given."""
    limits = ("--ulimit=nofile=4096:4096", "--ulimit=nproc=4096:4096")
    candidates: list[tuple[tuple[str, ...], tuple[str, ...]]] = [((), ()), ((), limits)]
    if shutil.which("runc"):
        candidates += [(("--runtime=runc",), ()), (("--runtime=runc",), limits)]
    errors = []
    for runtime, flags in candidates:
        got = _podman(*runtime, "run", "--rm", *flags, ref, "--version")
        if got.returncode == 0:
            return Image(ref, runtime, flags)
        errors.append(f"{' '.join(runtime + flags) or 'defaults'}: {got.stderr.strip()[-300:]}")
    pytest.skip("podman cannot run a container on this machine:\n" + "\n".join(errors))


@pytest.fixture(scope="module")
def image() -> Image:
    if shutil.which("podman") is None or shutil.which("buildah") is None:
        pytest.skip("podman/buildah missing: `scripts/image.sh install` as root installs them")
    if shutil.which("mmdebstrap") is None:
        pytest.skip("mmdebstrap missing: `scripts/image.sh install` as root installs it")
    if os.geteuid() != 0:
        pytest.skip("not root: the image is built and run with rootful podman")
    if not _user_namespaces():
        pytest.skip("no user namespaces on this machine (max_user_namespaces is 0)")
    started = time.monotonic()
    built = subprocess.run(
        [str(ROOT / "scripts" / "image.sh"), "build"],
        capture_output=True,
        text=True,
        timeout=840,
        check=False,
    )
    assert built.returncode == 0, built.stderr[-4000:]
    ref = built.stdout.strip().splitlines()[-1]
    print(f"scripts/image.sh build: {time.monotonic() - started:.0f} s -> {ref}")
    return _runnable(ref)


def _run(image: Image, *args: str, env: dict[str, str]) -> list[str]:
    """`podman run` arguments for the image on the host's network. Secrets go by
    name (`--env NAME`): podman reads their values from its own environment, so
    they never appear on a command line."""
    names = [f"--env={name}" for name in env]
    return [*image.runtime, "run", "--network=host", *image.run_flags, *names, *args]


@pytest.fixture
async def fresh_database(services: tuple[str, str]) -> AsyncIterator[str]:
    """An empty database of the test's own: the image's migration makes its tables."""
    url = await create_database(services[0], "reservo_image")
    yield url
    await drop_database(services[0], url)


async def test_image_migrates_books_and_stops_within_the_drain(
    image: Image, fresh_database: str, services: tuple[str, str]
) -> None:
    port = free_port()
    env = {
        **SECRETS,
        "RESERVO_DATABASE_URL": fresh_database,
        "RESERVO_REDIS_URL": services[1],
        "RESERVO_REDIS_NAMESPACE": f"image-{uuid.uuid4().hex[:8]}",
        "RESERVO_HTTP_PORT": str(port),
        "RESERVO_HTTP_DRAIN_S": str(DRAIN_S),
    }
    podman_env = {**os.environ, **env}

    migrate = await asyncio.to_thread(
        _podman,
        *_run(image, "--rm", image.ref, "db", "migrate", env=env),
        timeout=180,
        env=podman_env,
    )
    assert migrate.returncode == 0, migrate.stdout + migrate.stderr
    db = await asyncpg.connect(fresh_database)
    try:
        applied = await db.fetchval("SELECT count(*) FROM schema_migrations")
    finally:
        await db.close()
    assert applied > 0, "reservo db migrate in the image applied no migration"

    name = f"reservo-test-{uuid.uuid4().hex[:8]}"
    started = _podman(
        *_run(image, "--detach", f"--name={name}", image.ref, "api", env=env), env=podman_env
    )
    assert started.returncode == 0, started.stderr
    try:
        base = f"http://127.0.0.1:{port}"
        _wait_ready(base, name)

        who = _podman("exec", name, "id", "-u")
        assert who.stdout.strip() == IMAGE_USER_ID, who.stdout + who.stderr
        health = _podman("healthcheck", "run", name)
        assert health.returncode == 0, f"HEALTHCHECK failed: {health.stdout} {health.stderr}"

        async with httpx.AsyncClient(base_url=base, timeout=10) as client:
            _, slots = await make_slots(client)
            patient = new_id()
            booked = await book(client, slots[0]["id"], patient)
            assert booked.status_code == 201, booked.text
            appointment = booked.json()
            seen = await client.get(
                f"/api/appointments/{appointment['id']}", headers=auth("patient", patient)
            )
            assert seen.status_code == 200, seen.text
            assert seen.json()["slotId"] == slots[0]["id"]

        t0 = time.monotonic()
        stop = await asyncio.to_thread(
            _podman, "stop", "-t", str(STOP_TIMEOUT_S), name, timeout=STOP_TIMEOUT_S + 30
        )
        took = time.monotonic() - t0
        assert stop.returncode == 0, stop.stderr
        state = _podman("inspect", "--format", "{{.State.ExitCode}}", name).stdout.strip()
        logs = _podman("logs", name)
        assert state == "0", f"exit code {state} after {took:.1f} s:\n{logs.stdout}{logs.stderr}"
        # It served through the drain window, then left on its own, long before
        # podman's SIGKILL.
        assert DRAIN_S * 0.9 <= took < STOP_TIMEOUT_S - 5, f"stopped in {took:.1f} s"
    finally:
        _podman("rm", "--force", name)


async def test_a_stop_while_starting_is_not_ignored(
    image: Image, own_database: str, services: tuple[str, str]
) -> None:
    """SIGTERM in the first moments, before reservo installs its handlers, must end
    the container at once, not wait for the kill deadline: as process 1 (without
    tini) reservo would never see it, the kernel drops signals process 1 does not
    handle, and it would run on until SIGKILL (137)."""
    name = f"reservo-test-{uuid.uuid4().hex[:8]}"
    env = {
        **SECRETS,
        "RESERVO_DATABASE_URL": own_database,
        "RESERVO_REDIS_URL": services[1],
        "RESERVO_REDIS_NAMESPACE": f"image-{uuid.uuid4().hex[:8]}",
        "RESERVO_HTTP_PORT": str(free_port()),
    }
    started = _podman(
        *_run(image, "--detach", f"--name={name}", image.ref, "api", env=env),
        env={**os.environ, **env},
    )
    assert started.returncode == 0, started.stderr
    try:
        t0 = time.monotonic()
        stop = await asyncio.to_thread(
            _podman, "stop", "-t", str(STOP_TIMEOUT_S), name, timeout=STOP_TIMEOUT_S + 30
        )
        took = time.monotonic() - t0
        assert stop.returncode == 0, stop.stderr
        state = _podman("inspect", "--format", "{{.State.ExitCode}}", name).stdout.strip()
        assert state != "137", f"killed after {took:.1f} s: SIGTERM was ignored"
        assert took < STOP_TIMEOUT_S - 5, f"stopped in {took:.1f} s"
    finally:
        _podman("rm", "--force", name)


def _wait_ready(base: str, name: str, timeout_s: float = 60) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        try:
            if httpx.get(f"{base}/readyz", timeout=2).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        running = _podman("inspect", "--format", "{{.State.Running}}", name).stdout.strip()
        if running != "true":
            logs = _podman("logs", name)
            raise AssertionError(f"the container stopped:\n{logs.stdout}{logs.stderr}")
        time.sleep(0.3)
    logs = _podman("logs", name)
    raise AssertionError(f"{base}/readyz not 200 in {timeout_s} s:\n{logs.stdout}{logs.stderr}")
