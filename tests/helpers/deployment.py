"""reservo deployed as its users deploy it, for the acceptance suite (tests/acceptance):
the installed entry point (`.venv/bin/reservo`) started as processes, configured by
environment variables alone, reached over HTTP alone.

Two layouts: ``up`` (one `reservo up` process: API and every worker, pointed at a
PostgreSQL and a Redis by their URLs) and ``split`` (`reservo db migrate`, then
`reservo api --workers 2` and `reservo worker --roles all` as separate processes, as
docs/DEPLOY.md runs them)."""

from __future__ import annotations

import os
import subprocess
import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

import httpx

from tests.helpers.auth import JWT_SECRET, PAY_SECRET, RESULTS_SECRET
from tests.helpers.procs import BIN, free_port

Layout = Literal["up", "split"]

# The secrets of a deployment that is not the demo (the demo generates its own).
SECRETS = {
    "RESERVO_JWT_SECRET": JWT_SECRET,
    "RESERVO_PAYMENTS_WEBHOOK_SECRET": PAY_SECRET,
    "RESERVO_RESULTS_WEBHOOK_SECRET": RESULTS_SECRET,
}


def clean_environment() -> dict[str, str]:
    """This process's environment without any RESERVO_* variable: what a
    deployment sets is all the service reads (PATH, PYTHONPATH and HOME stay)."""
    return {k: v for k, v in os.environ.items() if not k.startswith("RESERVO_")}


@dataclass
class Deployment:
    """reservo's processes in ``layout``, with ``env`` (RESERVO_* variables) on
    ``port``, run from ``cwd`` (where `reservo up --demo` keeps its ./.reservo);
    each process's output in ``cwd``/<name>.log."""

    layout: Layout
    env: dict[str, str]
    cwd: Path
    demo: bool = False
    port: int = field(default_factory=free_port)
    procs: dict[str, subprocess.Popen[bytes]] = field(default_factory=dict)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def _environment(self) -> dict[str, str]:
        return {**clean_environment(), **self.env, "RESERVO_HTTP_PORT": str(self.port)}

    def _spawn(self, name: str, args: Sequence[str]) -> None:
        out = (self.cwd / f"{name}.log").open("ab")
        try:
            self.procs[name] = subprocess.Popen(
                [str(BIN), *args],
                env=self._environment(),
                cwd=self.cwd,
                stdout=out,
                stderr=subprocess.STDOUT,
            )
        finally:
            out.close()  # the child holds its own copy

    def start(self, timeout_s: float = 90) -> None:
        if self.layout == "up":
            self._spawn("up", ["up", "--demo"] if self.demo else ["up"])
        else:
            migrate = subprocess.run(
                [str(BIN), "db", "migrate"],
                env=self._environment(),
                cwd=self.cwd,
                capture_output=True,
                text=True,
                timeout=120,
                check=False,
            )
            assert migrate.returncode == 0, migrate.stdout + migrate.stderr
            self._spawn("api", ["api", "--workers", "2"])
            self._spawn("worker", ["worker", "--roles", "all"])
        self.wait_ready(timeout_s)

    def wait_ready(self, timeout_s: float) -> None:
        """Until /readyz answers 200 (PostgreSQL and Redis reached), failing with
        the logs when a process exits or the time runs out."""
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            for name, proc in self.procs.items():
                if proc.poll() is not None:
                    raise RuntimeError(f"{name} exited with {proc.returncode}:\n{self.logs()}")
            try:
                if httpx.get(f"{self.url}/readyz", timeout=2).status_code == 200:
                    return
            except httpx.HTTPError:
                pass
            time.sleep(0.2)
        raise TimeoutError(f"{self.url}/readyz not 200 after {timeout_s} s:\n{self.logs()}")

    def stop(self) -> None:
        """SIGTERM to every process, SIGKILL to one that has not stopped in 20 s."""
        for proc in self.procs.values():
            if proc.poll() is None:
                proc.terminate()
        for proc in self.procs.values():
            try:
                proc.wait(20)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
        self.procs.clear()

    def pids(self) -> set[int]:
        """The processes' ids; a process that exited is no longer counted."""
        return {proc.pid for proc in self.procs.values() if proc.poll() is None}

    def restart(self) -> None:
        self.stop()
        self.start()

    def logs(self) -> str:
        return "\n".join(
            f"--- {log.name}:\n{log.read_text(errors='replace')[-4000:]}"
            for log in sorted(self.cwd.glob("*.log"))
        )


# The ``deploy`` fixture (tests/acceptance/conftest.py): ``await deploy("split",
# http_header_timeout_s=2)`` is a started Deployment of the test module's own.
Deploy = Callable[..., Awaitable[Deployment]]
