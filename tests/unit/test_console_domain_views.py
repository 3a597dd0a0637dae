"""The console's pure view helpers: the car timeline's geometry and the manual
result's provider event id."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from reservo.betting.schemas import ResultIn
from reservo.console.betting import manual_event_id
from reservo.console.rentals import ROW_H, TOP, WIDTH, timeline
from reservo.rentals.domain import BlockedPeriod

START = datetime(2026, 12, 1, tzinfo=UTC)


def period(
    booking: int, day: float, days: float, status: str, buffer_h: float = 2
) -> BlockedPeriod:
    f = START + timedelta(days=day)
    to = f + timedelta(days=days)
    return BlockedPeriod(booking, f, to, to + timedelta(hours=buffer_h), status)


def test_each_booking_is_a_row_of_trip_then_buffer_labelled_in_words() -> None:
    bars = timeline(
        [period(1, 1, 2, "HOLD"), period(2, 5, 1, "CONFIRMED", buffer_h=0)],
        START,
        START + timedelta(days=10),
    )
    assert [(b.kind, b.short) for b in bars] == [
        ("HOLD", "HOLD #1"),
        ("buffer", "buffer"),
        ("CONFIRMED", "CONFIRMED #2"),  # no buffer: nothing drawn after it
    ]
    hold, buffer, confirmed = bars
    assert (hold.x, hold.width, hold.y) == (100.0, 200.0, TOP)
    assert buffer.x == 300.0 and round(buffer.width, 1) == round(WIDTH / 10 / 12, 1)
    assert confirmed.y == TOP + ROW_H


def test_a_booking_across_the_window_edges_is_clipped_to_it() -> None:
    (trip, buffer) = timeline([period(7, -1, 3, "ON_TRIP")], START, START + timedelta(days=1))
    assert (trip.x, trip.width) == (0.0, WIDTH)
    assert (buffer.x, buffer.width) == (WIDTH, 0.0)


def test_the_manual_event_id_is_the_same_for_the_same_match_and_result() -> None:
    def result(status: str, home: int | None, away: int | None) -> ResultIn:
        return ResultIn(
            match_external_id="m-1",
            status=status,
            home_score=home,
            away_score=away,
            provider_event_id="x",
        )

    assert manual_event_id("m-1", result("FINISHED", 2, 1)) == "console:m-1:FINISHED:2-1"
    assert manual_event_id("m-1", result("FINISHED", 2, 1)) == manual_event_id(
        "m-1", result("FINISHED", 2, 1)
    )
    assert manual_event_id("m-1", result("FINISHED", 1, 2)) != "console:m-1:FINISHED:2-1"
    assert manual_event_id("m-1", result("CANCELLED", None, None)) == "console:m-1:CANCELLED"
