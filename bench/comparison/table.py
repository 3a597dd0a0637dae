"""The comparison table: each figure's median on both sides and its gain.

The gain is oriented so that above 1 is better for every figure: new / old for a
rate, old / new for a latency, a CPU cost or a duration. A gain under the
threshold (0.95 by default) is a regression.
"""

from __future__ import annotations

import statistics
from collections.abc import Sequence
from dataclasses import dataclass, field

from .figures import Figure

REGRESSION_BELOW = 0.95


@dataclass
class Line:
    """One figure of one benchmark, every round's value on each side."""

    bench: str
    figure: Figure
    old: list[float] = field(default_factory=list)
    new: list[float] = field(default_factory=list)

    @property
    def old_median(self) -> float | None:
        return statistics.median(self.old) if self.old else None

    @property
    def new_median(self) -> float | None:
        return statistics.median(self.new) if self.new else None

    @property
    def gain(self) -> float | None:
        """new/old for a figure where higher is better, old/new otherwise; None
        while a side has no value."""
        old, new = self.old_median, self.new_median
        if old is None or new is None:
            return None
        better, worse = (new, old) if self.figure.higher_is_better else (old, new)
        if worse == 0:
            return 1.0 if better == 0 else float("inf")
        return better / worse

    def regressed(self, threshold: float = REGRESSION_BELOW) -> bool:
        gain = self.gain
        return gain is not None and gain < threshold


@dataclass(frozen=True)
class Sample:
    """The figures one run of one benchmark gave on one side ("old" or "new")."""

    bench: str
    side: str
    figures: dict[str, float]


def lines(
    figures_of: Sequence[tuple[str, Sequence[Figure]]], samples: Sequence[Sample]
) -> list[Line]:
    """A line per (benchmark, figure) in the order given, filled with the samples'
    values in the order they were taken."""
    table = {(bench, f.key): Line(bench, f) for bench, figures in figures_of for f in figures}
    for s in samples:
        for key, value in s.figures.items():
            line = table.get((s.bench, key))
            if line is not None:
                getattr(line, s.side).append(value)
    return list(table.values())


def number(value: float | None) -> str:
    """A figure as a reader compares it: thousands separated above 100, two or
    three significant digits below."""
    if value is None:
        return "n/a"
    if abs(value) >= 100:
        return f"{value:,.0f}"
    if abs(value) >= 10:
        return f"{value:.1f}"
    return f"{value:.2f}"


def _cell(median: float | None, values: Sequence[float]) -> str:
    """The median with every round in parentheses ("n/a" without a round)."""
    if not values:
        return "n/a"
    return f"{number(median)} ({' / '.join(number(v) for v in values)})"


HEADER = ("benchmark", "figure", "better", "old", "new", "gain (>1 better)", "")


def rows(table: Sequence[Line], threshold: float = REGRESSION_BELOW) -> list[tuple[str, ...]]:
    """The table's cells: medians with every round in parentheses, the gain, and a
    flag on a regression (or a side without a value)."""
    out: list[tuple[str, ...]] = []
    for line in table:
        gain = line.gain
        if gain is None:
            flag = "NO FIGURE"
        elif gain < threshold:
            flag = f"REGRESSION (< {threshold:g})"
        else:
            flag = ""
        out.append(
            (
                line.bench,
                line.figure.label,
                "higher" if line.figure.higher_is_better else "lower",
                _cell(line.old_median, line.old),
                _cell(line.new_median, line.new),
                "n/a" if gain is None else f"{gain:.2f}",
                flag,
            )
        )
    return out


def markdown(
    table: Sequence[Line], old_name: str, new_name: str, threshold: float = REGRESSION_BELOW
) -> str:
    """The table in Markdown, its side columns named after the two trees."""
    header = list(HEADER)
    header[3], header[4] = old_name, new_name
    text = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    for row in rows(table, threshold):
        cells = list(row)
        if cells[-1]:
            cells[-1] = f"**{cells[-1]}**"
        text.append("| " + " | ".join(cells) + " |")
    return "\n".join(text) + "\n"
