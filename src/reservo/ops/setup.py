"""Builds the operations module: dead letters, listed and replayed (admin)."""

from __future__ import annotations

from dataclasses import dataclass

from reservo.core.messaging.deadletters import DeadLetterBox
from reservo.core.module import Module
from reservo.ops.api import router
from reservo.shared import Shared


@dataclass(frozen=True, kw_only=True)
class Ops(Module):
    dead_letters: DeadLetterBox


def setup(shared: Shared) -> Ops:
    box = DeadLetterBox(shared.db, shared.clock, shared.subscriptions, shared.events)
    return Ops(name="ops", dead_letters=box, routers=[router], state={"dead_letters": box})
