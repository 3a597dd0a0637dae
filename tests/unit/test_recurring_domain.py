"""Recurring jobs' pure rules: the cron expression, the zone, and occurrences
computed on local wall times (DST: a skipped hour runs once at the next valid
instant, a repeated hour runs once)."""

from __future__ import annotations

import itertools
from datetime import UTC, datetime, timedelta

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from reservo.scheduler.domain import local_instant, occurrences, parse_cron, parse_zone

NY = parse_zone("America/New_York")


def utc(*a: int) -> datetime:
    return datetime(*a, tzinfo=UTC)


@pytest.mark.parametrize(
    "expr", ["61 * * * *", "* * * *", "* * * * * *", "0 0 30 2 *", "@daily", "x y z a b", ""]
)
def test_bad_cron_is_refused(expr: str) -> None:
    with pytest.raises(ValueError):
        parse_cron(expr)


def test_cron_is_normalised() -> None:
    assert parse_cron("  */5   1-3 * JAN mon ") == "*/5 1-3 * JAN mon"


@pytest.mark.parametrize("name", ["Mars/Olympus", "../etc/passwd", "localtime", "PST", "", "utc "])
def test_unknown_zone_is_refused(name: str) -> None:
    with pytest.raises(ValueError):
        parse_zone(name)


def test_skipped_hour_runs_once_at_the_next_valid_instant() -> None:
    # 2024-03-10, New York: 02:00 EST -> 03:00 EDT; 02:30 does not exist.
    got, nxt = occurrences("30 2 * * *", NY, utc(2024, 3, 9, 12), utc(2024, 3, 12, 12), 10)
    assert got == [utc(2024, 3, 10, 7), utc(2024, 3, 11, 6, 30), utc(2024, 3, 12, 6, 30)]
    assert got[0].astimezone(NY).isoformat() == "2024-03-10T03:00:00-04:00"
    assert nxt == utc(2024, 3, 13, 6, 30)
    # 02:00 and 02:30 both fall in the gap, like 03:00 after it: one job at 03:00.
    got, _ = occurrences("*/30 * * * *", NY, utc(2024, 3, 10, 6), utc(2024, 3, 10, 7, 31), 10)
    assert got == [utc(2024, 3, 10, 6, 30), utc(2024, 3, 10, 7), utc(2024, 3, 10, 7, 30)]


def test_repeated_hour_runs_once() -> None:
    # 2024-11-03, New York: 01:00-02:00 happens twice (EDT, then EST).
    got, _ = occurrences("30 1 * * *", NY, utc(2024, 11, 2, 12), utc(2024, 11, 4, 12), 10)
    assert got == [utc(2024, 11, 3, 5, 30), utc(2024, 11, 4, 6, 30)]
    got, _ = occurrences("*/30 * * * *", NY, utc(2024, 11, 3, 4), utc(2024, 11, 3, 7, 1), 20)
    local = [g.astimezone(NY).isoformat() for g in got]
    assert local == [
        "2024-11-03T00:30:00-04:00",
        "2024-11-03T01:00:00-04:00",
        "2024-11-03T01:30:00-04:00",
        "2024-11-03T02:00:00-05:00",
    ]
    # Starting inside the second pass of the hour: nothing before 02:00 EST.
    got, _ = occurrences("*/30 * * * *", NY, utc(2024, 11, 3, 6, 10), utc(2024, 11, 3, 7, 1), 20)
    assert got == [utc(2024, 11, 3, 7)]


def test_half_hour_shift_and_a_skipped_day() -> None:
    # Lord Howe moves by 30 minutes (02:00 -> 02:30 on 2024-10-06).
    lh = parse_zone("Australia/Lord_Howe")
    assert local_instant(datetime(2024, 10, 6, 2, 15), lh).astimezone(lh).isoformat() == (
        "2024-10-06T02:30:00+11:00"
    )
    # Samoa skipped 2011-12-30 entirely: its midnight runs once, at the next one.
    apia = parse_zone("Pacific/Apia")
    got, _ = occurrences("0 0 * * *", apia, utc(2011, 12, 28), utc(2012, 1, 1), 10)
    assert [g.astimezone(apia).date().isoformat() for g in got] == [
        "2011-12-28",
        "2011-12-29",
        "2011-12-31",
        "2012-01-01",
    ]


def test_limit_and_the_end_of_the_accepted_range() -> None:
    got, nxt = occurrences("* * * * *", UTC, utc(2024, 1, 1), utc(2025, 1, 1), 3)
    assert got == [utc(2024, 1, 1, 0, 1), utc(2024, 1, 1, 0, 2), utc(2024, 1, 1, 0, 3)]
    assert nxt == utc(2024, 1, 1, 0, 4)
    got, nxt = occurrences("59 23 31 12 *", UTC, utc(2099, 1, 1), utc(2100, 1, 1), 10)
    assert got == [utc(2099, 12, 31, 23, 59)] and nxt is None


ZONES = ["America/New_York", "Europe/London", "Australia/Lord_Howe", "Pacific/Apia", "UTC"]
CRONS = ["*/7 * * * *", "30 2 * * *", "0,30 1-3 * * 0", "15 */2 * * *", "0 0 1 * *"]


@settings(max_examples=200, deadline=None)
@given(
    zone=st.sampled_from(ZONES),
    cron=st.sampled_from(CRONS),
    start=st.datetimes(min_value=datetime(2005, 1, 1), max_value=datetime(2090, 1, 1)),
    chunk=st.integers(min_value=1, max_value=7),
)
def test_passes_in_chunks_see_the_same_occurrences_once(
    zone: str, cron: str, start: datetime, chunk: int
) -> None:
    """However the materialiser cuts the time line into passes (a cursor moved
    to the first occurrence not created), it creates the same strictly
    increasing instants as one pass, none twice, none skipped."""
    z = parse_zone(zone)
    after, until = start.replace(tzinfo=UTC), start.replace(tzinfo=UTC) + timedelta(days=3)
    whole, _ = occurrences(cron, z, after, until, 10_000)
    assert all(a < b for a, b in itertools.pairwise(whole))
    assert all(after < w < until for w in whole)
    pieces: list[datetime] = []
    cursor = after
    while True:
        got, nxt = occurrences(cron, z, cursor, until, chunk)
        pieces += got
        if nxt is None or nxt >= until:
            break
        cursor = nxt - timedelta(microseconds=1)  # next_at itself is an occurrence
    assert pieces == whole
