"""The two sides of a comparison: a release checked out into a temporary git
worktree, and the tree bench/compare.py runs from; each with a virtualenv of its
own, cached by what it was built from (a release's commit, the working tree's
pyproject.toml), so that a second run starts at once.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
import sys
import tempfile
import tomllib
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

RELEASES_FILE = Path("bench") / "releases.toml"
# What a benchmark imports beyond the service: psutil (a dependency of its own in
# the first releases, in the `embedded` extra since 0.3.0) and the `bench` extra.
EXTRAS = ("embedded", "bench")
ALWAYS = ("psutil>=5.9",)


@dataclass(frozen=True)
class Side:
    """A tree to benchmark and the interpreter of its venv."""

    name: str  # as the table shows it: "0.3.0 (53e1db8)", "HEAD (53e1db8+changes)"
    tree: Path
    python: Path
    bench_db: str  # the appointments benchmarks' database (BENCH_DB), one per side

    def env(self) -> dict[str, str]:
        """The environment a benchmark of this side runs in: its own package first on
        the path, its venv's `reservo` and Python first on PATH."""
        env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")}
        env["PYTHONPATH"] = f"{self.tree / 'src'}{os.pathsep}{self.tree}"
        env["PATH"] = f"{self.python.parent}{os.pathsep}{env.get('PATH', '')}"
        env["BENCH_DB"] = self.bench_db
        return env


def git(repo: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        ["git", "-C", str(repo), *args], capture_output=True, text=True, timeout=120, check=False
    )


def release_commit(name: str, releases_toml: str) -> str | None:
    """The commit a release names in bench/releases.toml's text, or None."""
    releases = tomllib.loads(releases_toml).get("releases", {})
    commit = releases.get(name)
    return str(commit) if commit is not None else None


def resolve(name: str, repo: Path) -> str:
    """The full commit of ``name``: the git tag first, then bench/releases.toml, then
    anything git takes for a commit (a hash, a branch)."""
    candidates = [f"refs/tags/{name}"]
    listed = repo / RELEASES_FILE
    if listed.exists():
        commit = release_commit(name, listed.read_text())
        if commit is not None:
            candidates.append(commit)
    candidates.append(name)
    for ref in candidates:
        found = git(repo, "rev-parse", "--verify", "--quiet", f"{ref}^{{commit}}")
        if found.returncode == 0:
            return found.stdout.strip()
    raise LookupError(
        f"{name!r} is neither a git tag, a release in {RELEASES_FILE} nor a commit here "
        "(a shallow clone lacks the history: fetch it)"
    )


def describe_work_tree(repo: Path) -> str:
    """HEAD's short hash, with "+changes" when the tree differs from it."""
    head = git(repo, "rev-parse", "--short=7", "HEAD").stdout.strip() or "no git"
    dirty = git(repo, "status", "--porcelain", "--untracked-files=no").stdout.strip()
    return f"{head}+changes" if dirty else head


@contextmanager
def checked_out(repo: Path, commit: str) -> Iterator[Path]:
    """``commit`` in a temporary detached worktree of ``repo``, removed afterwards."""
    scratch = Path(tempfile.mkdtemp(prefix="reservo-compare-"))
    tree = scratch / commit[:12]
    added = git(repo, "worktree", "add", "--detach", str(tree), commit)
    if added.returncode != 0:
        shutil.rmtree(scratch, ignore_errors=True)
        raise RuntimeError(f"git worktree add failed: {added.stderr.strip()}")
    try:
        yield tree
    finally:
        git(repo, "worktree", "remove", "--force", str(tree))
        shutil.rmtree(scratch, ignore_errors=True)
        git(repo, "worktree", "prune")


def extras_of(tree: Path) -> list[str]:
    """The extras among EXTRAS that the tree's pyproject.toml defines."""
    project = tomllib.loads((tree / "pyproject.toml").read_text()).get("project", {})
    defined = project.get("optional-dependencies", {})
    return [e for e in EXTRAS if e in defined]


def venv_key(tree: Path, commit: str | None) -> str:
    """A release's venv is its commit's; the working tree's, its pyproject.toml's."""
    if commit is not None:
        return commit
    digest = hashlib.sha256((tree / "pyproject.toml").read_bytes()).hexdigest()
    return f"work-{digest[:16]}"


def venv_for(tree: Path, key: str, cache: Path, log: Path) -> tuple[Path, bool]:
    """The cached venv ``key``, built from ``tree`` when absent or left half-built
    (`python -m venv`, then the tree installed with its benchmark extras); returns
    its Python and whether it was built now. The install's output goes to ``log``."""
    home = cache / "venvs" / key
    python = home / "bin" / "python"
    if (home / ".complete").exists() and python.exists():
        return python, False
    # Built at its final path (a venv's scripts name it); marked complete last.
    shutil.rmtree(home, ignore_errors=True)
    home.parent.mkdir(parents=True, exist_ok=True)
    extras = extras_of(tree)
    spec = f"{tree}[{','.join(extras)}]" if extras else str(tree)
    with log.open("a") as out:
        for step in (
            [sys.executable, "-m", "venv", str(home)],
            [str(python), "-m", "pip", "install", "-q", spec, *ALWAYS],
        ):
            out.write(f"$ {' '.join(step)}\n")
            out.flush()
            done = subprocess.run(step, stdout=out, stderr=subprocess.STDOUT, check=False)
            if done.returncode != 0:
                raise RuntimeError(f"building the venv failed ({' '.join(step)}); see {log}")
    (home / ".complete").write_text(f"{tree}\n")
    return python, True
