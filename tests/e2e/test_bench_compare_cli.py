"""bench/compare.py as a release step runs it: its help, an unknown release or
benchmark refused with exit 2 before anything is built, and the releases it
resolves through git (a tag, else bench/releases.toml) at the commits
CHANGELOG.md names."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
from bench.comparison.trees import git, resolve

ROOT = Path(__file__).resolve().parents[2]


def compare(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, str(ROOT / "bench" / "compare.py"), *args],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )


def test_help_names_every_option_a_release_step_uses() -> None:
    done = compare("--help")
    assert done.returncode == 0, done.stderr
    for option in ("--against", "--duration", "--rounds", "--only", "--report-only"):
        assert option in done.stdout


def test_an_unknown_release_is_refused_before_anything_runs(tmp_path: Path) -> None:
    done = compare("--against", "0.0.9-none", "--logs", str(tmp_path), "--cache-dir", str(tmp_path))
    assert done.returncode == 2
    assert "'0.0.9-none' is neither a git tag" in done.stdout
    assert not (tmp_path / "venvs").exists()


def test_an_unknown_benchmark_is_refused() -> None:
    done = compare("--against", "0.3.0", "--only", "storm,nope")
    assert done.returncode == 2
    assert "unknown benchmark(s) ['nope']" in done.stdout


@pytest.mark.parametrize(
    ("release", "commit"), [("0.1.0", "05f2ba6"), ("0.2.0", "27a422c"), ("0.3.0", "53e1db8")]
)
def test_each_release_resolves_to_its_last_commit(release: str, commit: str) -> None:
    if git(ROOT, "cat-file", "-e", f"{commit}^{{commit}}").returncode:
        pytest.skip(f"SKIPPED LOUDLY: {commit} is not in this clone (shallow?): fetch the history")
    assert resolve(release, ROOT).startswith(commit)
