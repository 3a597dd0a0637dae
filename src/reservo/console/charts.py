"""Small time-series charts drawn on the server as inline SVG (no JS library).

Pure geometry: a series of per-second counts becomes the points of an SVG
polyline plus the figures printed beside it (so the chart reads without colour
and without the picture)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

WIDTH = 300
HEIGHT = 60
# The "now" figure: the mean of the last seconds (one second alone is jumpy).
RECENT_S = 10


@dataclass(frozen=True)
class Sparkline:
    name: str
    title: str
    points: str  # SVG polyline points, in a WIDTH x HEIGHT box
    area: str  # the same line closed along the bottom edge
    recent_per_s: float  # mean per second over the last RECENT_S seconds
    peak: int  # highest one-second count in the window
    total: int  # sum over the window
    window_s: int


def sparkline(name: str, title: str, values: Sequence[int]) -> Sparkline:
    n = len(values)
    peak = max(values, default=0)
    top = max(peak, 1)
    step = WIDTH / max(n - 1, 1)
    coords = [
        f"{i * step:.1f},{HEIGHT - 2 - (v / top) * (HEIGHT - 4):.1f}" for i, v in enumerate(values)
    ]
    points = " ".join(coords)
    area = f"0,{HEIGHT} {points} {WIDTH},{HEIGHT}" if coords else ""
    recent = values[-RECENT_S:]
    return Sparkline(
        name=name,
        title=title,
        points=points,
        area=area,
        recent_per_s=sum(recent) / len(recent) if recent else 0.0,
        peak=peak,
        total=sum(values),
        window_s=n,
    )


def percent(part: int, whole: int) -> int:
    """Whole percent of ``part`` in ``whole`` (0 when there is nothing)."""
    return 0 if whole <= 0 else min(100, part * 100 // whole)
