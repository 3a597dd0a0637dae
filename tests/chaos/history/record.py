"""The history: every operation a client invoked and how it completed."""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Literal

Outcome = Literal["ok", "fail", "info"]


@dataclass
class Op:
    """One client operation. ``args`` is what was asked (its identity: a unique
    reference, amount or patient the checker finds it by), ``value`` what the
    service answered on ``ok`` (the id it gave)."""

    index: int
    kind: str
    args: dict[str, Any]
    invoked_at: float
    outcome: Outcome | None = None
    value: dict[str, Any] = field(default_factory=dict)
    completed_at: float | None = None
    why: str = ""
    attempts: int = 0  # HTTP requests sent for it (retries under one Idempotency-Key)


@dataclass
class History:
    ops: list[Op] = field(default_factory=list)

    def invoke(self, kind: str, **args: Any) -> Op:
        op = Op(len(self.ops), kind, args, time.monotonic())
        self.ops.append(op)
        return op

    def _complete(self, op: Op, outcome: Outcome, why: str, value: dict[str, Any]) -> None:
        assert op.outcome is None, f"op {op.index} completed twice"
        op.outcome, op.why, op.value = outcome, why, value
        op.completed_at = time.monotonic()

    def ok(self, op: Op, **value: Any) -> None:
        self._complete(op, "ok", "", value)

    def fail(self, op: Op, why: str) -> None:
        """A definitive refusal: the operation must have had no effect."""
        self._complete(op, "fail", why, {})

    def info(self, op: Op, why: str) -> None:
        """The client does not know what happened (0 or 1 effect)."""
        self._complete(op, "info", why, {})

    def of(self, *kinds: str) -> Iterator[Op]:
        return (op for op in self.ops if op.kind in kinds)

    def counts(self) -> dict[str, int]:
        out: dict[str, int] = {}
        for op in self.ops:
            key = f"{op.kind}:{op.outcome or 'pending'}"
            out[key] = out.get(key, 0) + 1
        return dict(sorted(out.items()))

    def dump(self, path: Path) -> None:
        """JSON lines, one operation each: to read a failed run afterwards."""
        with path.open("w") as out:
            for op in self.ops:
                out.write(json.dumps(asdict(op), default=str) + "\n")
