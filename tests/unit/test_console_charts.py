"""The overview's server-drawn charts (pure geometry)."""

from __future__ import annotations

from reservo.console.charts import HEIGHT, WIDTH, percent, sparkline


def test_a_series_becomes_one_point_per_second_scaled_to_its_peak() -> None:
    values = [0, 2, 4, 0]
    s = sparkline("booked", "Booked", values)
    points = [tuple(map(float, p.split(","))) for p in s.points.split()]
    assert len(points) == 4
    assert points[0][0] == 0 and points[-1][0] == WIDTH
    ys = [y for _, y in points]
    assert min(ys) == ys[2] and ys[2] >= 0  # the peak is the highest point
    assert ys[0] == ys[3] == HEIGHT - 2  # zeros sit on the baseline
    assert (s.peak, s.total, s.window_s) == (4, 6, 4)


def test_the_recent_rate_is_the_mean_of_the_last_ten_seconds() -> None:
    s = sparkline("x", "X", [100] * 5 + [1] * 10)
    assert s.recent_per_s == 1.0
    assert sparkline("x", "X", [3, 3]).recent_per_s == 3.0


def test_an_empty_or_flat_series_draws_a_baseline() -> None:
    flat = sparkline("x", "X", [0] * 300)
    assert flat.peak == 0 and flat.total == 0 and flat.recent_per_s == 0.0
    assert {p.split(",")[1] for p in flat.points.split()} == {f"{HEIGHT - 2:.1f}"}
    empty = sparkline("x", "X", [])
    assert empty.points == "" and empty.area == ""


def test_percent() -> None:
    assert percent(0, 0) == 0
    assert percent(1, 3) == 33
    assert percent(5, 5) == 100
    assert percent(7, 5) == 100
