"""Retry delays: exponential growth, capped, with jitter so retries of many
failed items do not arrive together."""

from __future__ import annotations

import random


def backoff_delay(
    attempt: int, base_s: float, cap_s: float, rng: random.Random | None = None
) -> float:
    """Delay before retry number ``attempt`` (1-based): "equal jitter", half fixed
    and half random, so the delay still grows with every attempt."""
    ceiling = min(cap_s, base_s * (2 ** max(0, attempt - 1)))
    r = (rng or random).random()
    return ceiling / 2 + r * ceiling / 2
