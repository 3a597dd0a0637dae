"""The README's shell blocks, run with bash as a reader pastes them, every `curl`
recorded: its arguments, exit status, HTTP status line and body.

A block continues the shell of the blocks before it under the same `## ` heading
(the README's second block of "Try it" uses the first one's variables), so a
section is one bash session. The text runs as written: the README's blocks set
``BASE`` from ``PORT``, which the session's environment sets to the demo's port
(as a reader who started ``make demo PORT=...`` exports it)."""

from __future__ import annotations

import json
import os
import re
import subprocess
from dataclasses import dataclass
from pathlib import Path
from typing import Any

README = Path(__file__).resolve().parents[2] / "README.md"

# Every `curl` of a block goes through this function: the same arguments and the
# same output, plus a record of the call in $CURL_CALLS/<n>/ (n in call order).
# -D writes the answer's headers to a file and changes nothing else curl prints.
RECORDER = r"""
set -euo pipefail
curl() {
  local n call rc
  n=$(find "$CURL_CALLS" -mindepth 1 -maxdepth 1 | wc -l)
  call="$CURL_CALLS/$(printf %04d "$n")"
  mkdir "$call"
  printf '%s\0' "$@" > "$call/args"
  rc=0
  command curl -D "$call/head" "$@" | tee "$call/body" || rc=${PIPESTATUS[0]}
  echo "$rc" > "$call/rc"
  return "$rc"
}
"""


@dataclass(frozen=True)
class Block:
    section: str
    line: int  # of the opening fence, 1-based
    text: str


def shell_blocks(readme: Path = README) -> list[Block]:
    """Every ```sh block of the README with the `## ` heading above it ("" above
    the first heading)."""
    blocks: list[Block] = []
    section, opened, lines = "", 0, list[str]()
    for number, line in enumerate(readme.read_text().splitlines(), 1):
        if opened:
            if line.startswith("```"):
                blocks.append(Block(section, opened, "\n".join(lines) + "\n"))
                opened, lines = 0, []
            else:
                lines.append(line)
        elif line.startswith("```sh"):
            opened = number
        elif line.startswith("## "):
            section = line[3:].strip()
    return blocks


def sessions(blocks: list[Block]) -> dict[str, list[Block]]:
    """The blocks of each section, in order: one bash session each."""
    grouped: dict[str, list[Block]] = {}
    for block in blocks:
        grouped.setdefault(block.section, []).append(block)
    return grouped


@dataclass(frozen=True)
class Call:
    """One `curl` a block ran."""

    args: list[str]
    exit: int
    status: int  # 0 when no answer arrived
    body: str

    @property
    def method(self) -> str:
        if "-X" in self.args:
            return self.args[self.args.index("-X") + 1]
        if "-I" in self.args or "-sI" in self.args:
            return "HEAD"
        return "POST" if "-d" in self.args else "GET"

    @property
    def path(self) -> str:
        """The path of the URL argument (``$BASE/api/...`` expanded, ``http://...``)."""
        for arg in self.args:
            if url := re.match(r"(https?://)?[\w.-]+(:\d+)?(?P<path>/[^?\s]*)", arg):
                return url["path"]
        raise ValueError(f"no URL among {self.args}")

    def json(self) -> Any:
        return json.loads(self.body)

    def __str__(self) -> str:
        return f"{self.method} {self.path} -> {self.status} (curl exit {self.exit}): {self.body!r}"


@dataclass(frozen=True)
class Run:
    process: subprocess.CompletedProcess[str]
    calls: list[Call]


def _calls(folder: Path) -> list[Call]:
    calls = []
    for call in sorted(p for p in folder.iterdir() if p.is_dir()):
        head = (call / "head").read_text(errors="replace") if (call / "head").exists() else ""
        # The last status line: curl writes one per answer (100 Continue, redirects).
        statuses = re.findall(r"^HTTP/\S+ (\d{3})", head, re.M)
        calls.append(
            Call(
                args=(call / "args").read_text().split("\0")[:-1],
                exit=int((call / "rc").read_text()),
                status=int(statuses[-1]) if statuses else 0,
                body=(call / "body").read_text(errors="replace"),
            )
        )
    return calls


def run_session(blocks: list[Block], cwd: Path, port: int, calls: Path) -> Run:
    """The blocks as one bash script (``set -euo pipefail``: a command that fails
    ends it), run in ``cwd`` against the service on ``port``."""
    calls.mkdir(parents=True)
    script = RECORDER + "\n".join(b.text for b in blocks)
    process = subprocess.run(
        ["bash", "-c", script],
        cwd=cwd,
        # A reader's shell: the README puts .venv/bin on PATH itself. PYTHONPATH
        # passes on, so that a checkout run with it tests its own code.
        env={
            "CURL_CALLS": str(calls),
            "PATH": "/usr/local/bin:/usr/bin:/bin",
            "HOME": str(cwd),
            "PORT": str(port),
            **{k: v for k, v in os.environ.items() if k == "PYTHONPATH"},
        },
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    return Run(process, _calls(calls))
