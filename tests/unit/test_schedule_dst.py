"""Pure scheduling rules (no I/O): local working hours -> UTC slots across DST changes."""

from __future__ import annotations

import itertools
from datetime import UTC, date, datetime, time, timedelta
from zoneinfo import ZoneInfo

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from reservo.appointments.domain import (
    ScheduleRule,
    Slot,
    day_bounds,
    expand,
    local_date,
    local_instant,
    zone,
)
from reservo.core.kernel.timezones import UnknownZone, zone_names

ALL_DAYS = frozenset(range(1, 8))
LISBON, NEW_YORK = ZoneInfo("Europe/Lisbon"), ZoneInfo("America/New_York")
# 2026 transitions: Lisbon 29 Mar 01:00 WET -> 02:00 WEST, 25 Oct 02:00 WEST -> 01:00 WET;
# New York 8 Mar 02:00 EST -> 03:00 EDT, 1 Nov 02:00 EDT -> 01:00 EST.
LISBON_SPRING, LISBON_FALL = date(2026, 3, 29), date(2026, 10, 25)
NY_SPRING, NY_FALL = date(2026, 3, 8), date(2026, 11, 1)


def rule(
    first: date,
    last: date | None = None,
    start: time = time(0),
    end: time = time(6),
    minutes: int = 15,
    weekdays: frozenset[int] = ALL_DAYS,
) -> ScheduleRule:
    return ScheduleRule(first, last or first, weekdays, start, end, minutes, 1)


def utc(y: int, mo: int, d: int, h: int, mi: int = 0) -> datetime:
    return datetime(y, mo, d, h, mi, tzinfo=UTC)


def quarter_hours(first: datetime, count: int) -> list[datetime]:
    return [first + timedelta(minutes=15 * i) for i in range(count)]


def assert_well_formed(slots: list[Slot], step: timedelta) -> None:
    """Strictly increasing UTC starts, every slot one step long, no overlap."""
    for s in slots:
        assert s.start_at.utcoffset() == timedelta(0)
        assert s.end_at - s.start_at == step
    starts = [s.start_at for s in slots]
    assert len(set(starts)) == len(starts), "duplicate instants"
    for a, b in itertools.pairwise(slots):
        assert a.start_at < b.start_at
        assert a.end_at <= b.start_at, f"{a} overlaps {b}"


def assert_contiguous(slots: list[Slot], step: timedelta) -> None:
    """Within one working period there is no hole: each slot starts where the last ended."""
    for a, b in itertools.pairwise(slots):
        assert b.start_at - a.start_at == step


# -- working hours that span the change --------------------------------------------


@pytest.mark.parametrize(
    ("tz", "day", "first_utc", "count"),
    [
        # 00:00 WET = 00:00Z .. 06:00 WEST = 05:00Z: one hour shorter.
        (LISBON, LISBON_SPRING, utc(2026, 3, 29, 0), 20),
        # 00:00 WEST = 23:00Z the day before .. 06:00 WET = 06:00Z: one hour longer.
        (LISBON, LISBON_FALL, utc(2026, 10, 24, 23), 28),
        # 00:00 EST = 05:00Z .. 06:00 EDT = 10:00Z.
        (NEW_YORK, NY_SPRING, utc(2026, 3, 8, 5), 20),
        # 00:00 EDT = 04:00Z .. 06:00 EST = 11:00Z.
        (NEW_YORK, NY_FALL, utc(2026, 11, 1, 4), 28),
    ],
    ids=["lisbon-spring", "lisbon-fall", "new-york-spring", "new-york-fall"],
)
def test_hours_spanning_a_dst_change_step_in_absolute_time(
    tz: ZoneInfo, day: date, first_utc: datetime, count: int
) -> None:
    slots = expand(rule(day), tz)
    step = timedelta(minutes=15)
    assert len(slots) == count  # not the 24 quarter-hours of an ordinary night
    assert [s.start_at for s in slots] == quarter_hours(first_utc, count)
    assert_well_formed(slots, step)
    assert_contiguous(slots, step)
    # Every slot belongs to that local date, and the last one ends at local 06:00.
    assert {local_date(s.start_at, tz) for s in slots} == {day}
    assert slots[-1].end_at.astimezone(tz).time() == time(6)


def test_fall_back_repeated_hour_appears_twice_in_local_time_but_never_twice_in_utc() -> None:
    slots = expand(rule(NY_FALL), NEW_YORK)
    local = [s.start_at.astimezone(NEW_YORK) for s in slots]
    one_thirty = [t for t in local if t.time() == time(1, 30)]
    # The wall clock reads 01:30 twice (EDT then EST), an hour apart in real time.
    assert [t.fold for t in one_thirty] == [0, 1]
    # (Aware datetimes of one zone subtract as wall times, so compare in UTC.)
    assert one_thirty[1].astimezone(UTC) - one_thirty[0].astimezone(UTC) == timedelta(hours=1)
    assert len({s.start_at for s in slots}) == len(slots)


def test_spring_forward_skipped_hour_yields_no_local_time_inside_the_gap() -> None:
    slots = expand(rule(NY_SPRING), NEW_YORK)
    local_times = [s.start_at.astimezone(NEW_YORK).time() for s in slots]
    assert not [t for t in local_times if time(2) <= t < time(3)]
    assert time(1, 45) in local_times and time(3) in local_times


@pytest.mark.parametrize(
    ("tz", "day", "first_utc"),
    [
        (LISBON, LISBON_SPRING - timedelta(days=1), utc(2026, 3, 28, 8)),  # WET, +00:00
        (LISBON, LISBON_SPRING, utc(2026, 3, 29, 7)),  # WEST, +01:00
        (LISBON, LISBON_FALL - timedelta(days=1), utc(2026, 10, 24, 7)),  # WEST
        (LISBON, LISBON_FALL, utc(2026, 10, 25, 8)),  # WET
        (NEW_YORK, NY_SPRING - timedelta(days=1), utc(2026, 3, 7, 13)),  # EST, -05:00
        (NEW_YORK, NY_SPRING, utc(2026, 3, 8, 12)),  # EDT, -04:00
        (NEW_YORK, NY_FALL - timedelta(days=1), utc(2026, 10, 31, 12)),  # EDT
        (NEW_YORK, NY_FALL, utc(2026, 11, 1, 13)),  # EST
    ],
)
def test_office_hours_on_and_around_dst_dates_use_that_days_offset(
    tz: ZoneInfo, day: date, first_utc: datetime
) -> None:
    slots = expand(rule(day, start=time(8), end=time(18)), tz)
    assert [s.start_at for s in slots] == quarter_hours(first_utc, 40)
    assert all(
        time(8) <= s.start_at.astimezone(tz).time() < time(18) and s.start_at.tzinfo is UTC
        for s in slots
    )


def test_a_week_across_the_change_keeps_local_hours_and_weekdays() -> None:
    # Mon 23 Mar .. Sun 5 Apr 2026, weekdays Mon/Wed/Sun only, 09:00-10:00 local.
    slots = expand(
        rule(
            date(2026, 3, 23),
            date(2026, 4, 5),
            start=time(9),
            end=time(10),
            minutes=30,
            weekdays=frozenset({1, 3, 7}),
        ),
        LISBON,
    )
    days = sorted({local_date(s.start_at, LISBON) for s in slots})
    assert [d.isoweekday() for d in days] == [1, 3, 7, 1, 3, 7]
    assert len(slots) == 12
    assert {s.start_at.astimezone(LISBON).strftime("%H:%M") for s in slots} == {"09:00", "09:30"}
    # Before the change 09:00 is 09:00Z, after it 08:00Z.
    assert slots[0].start_at == utc(2026, 3, 23, 9)
    assert slots[-2].start_at == utc(2026, 4, 5, 8)
    assert_well_formed(slots, timedelta(minutes=30))


# -- the helpers -----------------------------------------------------------------------


def test_local_instant_maps_a_skipped_time_forward_and_a_repeated_one_to_its_first_occurrence():
    # 02:30 does not exist on 8 Mar 2026 in New York: it is read as 03:30 EDT.
    assert local_instant(NY_SPRING, time(2, 30), NEW_YORK) == utc(2026, 3, 8, 7, 30)
    # 01:30 happens twice on 1 Nov 2026: the first (EDT) is taken.
    assert local_instant(NY_FALL, time(1, 30), NEW_YORK) == utc(2026, 11, 1, 5, 30)


@pytest.mark.parametrize(
    ("tz", "day", "hours"),
    [
        (LISBON, LISBON_SPRING, 23),
        (LISBON, LISBON_FALL, 25),
        (LISBON, date(2026, 7, 1), 24),
        (NEW_YORK, NY_SPRING, 23),
        (NEW_YORK, NY_FALL, 25),
        (ZoneInfo("America/Sao_Paulo"), date(2026, 11, 1), 24),  # no DST since 2019
    ],
)
def test_day_bounds_are_23_or_25_hours_on_dst_days(tz: ZoneInfo, day: date, hours: int) -> None:
    start, end = day_bounds(day, tz)
    assert end - start == timedelta(hours=hours)
    assert start.astimezone(tz).replace(tzinfo=None) == datetime.combine(day, time(0))


@pytest.mark.parametrize(
    "name",
    [
        "Mars/Olympus",
        "",
        "../../etc/passwd",
        "/usr/share/zoneinfo/UTC",
        "europe/lisbon",
        "localtime",
        "Factory",
        "posixrules",
        "posix/Europe/Lisbon",
        "right/UTC",
    ],
)
def test_zone_refuses_names_that_are_not_iana_zones(name: str) -> None:
    with pytest.raises(UnknownZone):
        zone(name)


def test_zone_accepts_iana_names() -> None:
    assert zone("Europe/Lisbon") == LISBON
    assert zone("America/Sao_Paulo").key == "America/Sao_Paulo"


# -- properties --------------------------------------------------------------------------

ZONES = sorted(zone_names())  # every zone a doctor may have
DST_ZONES = [
    "Europe/Lisbon",
    "America/New_York",
    "America/Sao_Paulo",  # had DST until 2019, with changes at midnight
    "Australia/Lord_Howe",  # 30-minute DST
    "Antarctica/Troll",  # 2-hour DST
    "America/Havana",  # changes at midnight
    "Pacific/Apia",  # skipped a whole calendar day (30 Dec 2011)
    "Asia/Tehran",
]


@st.composite
def rules(draw: st.DrawFn) -> ScheduleRule:
    first = draw(st.dates(min_value=date(1970, 1, 1), max_value=date(2199, 12, 1)))
    length = draw(st.integers(min_value=0, max_value=20))
    start = draw(st.times())
    end = draw(st.times(min_value=time(0, 1)).filter(lambda t: t > start))
    minutes = draw(st.sampled_from([5, 10, 15, 20, 30, 45, 60, 90, 720]))
    weekdays = draw(st.frozensets(st.integers(1, 7), min_size=1))
    start, end = start.replace(second=0, microsecond=0), end.replace(second=0, microsecond=0)
    if end <= start:
        end = time(23, 59)
    return ScheduleRule(first, first + timedelta(days=length), weekdays, start, end, minutes, 1)


@settings(max_examples=300, deadline=None)
@given(rules(), st.sampled_from(ZONES) | st.sampled_from(DST_ZONES))
def test_expand_never_yields_overlapping_or_duplicate_slots(rule_: ScheduleRule, name: str) -> None:
    tz = ZoneInfo(name)
    slots = expand(rule_, tz)
    assert_well_formed(slots, timedelta(minutes=rule_.slot_minutes))
    for s in slots:
        # Each slot lies inside the working hours of a scheduled local weekday.
        day = local_date(s.start_at, tz)
        assert rule_.start_date <= day <= rule_.end_date
        assert day.isoweekday() in rule_.weekdays
        assert s.start_at >= local_instant(day, rule_.start_time, tz)
        assert s.end_at <= local_instant(day, rule_.end_time, tz)


@settings(max_examples=200, deadline=None)
@given(
    st.dates(min_value=date(1970, 1, 1), max_value=date(2199, 12, 31)),
    st.sampled_from(DST_ZONES),
    st.sampled_from([5, 10, 15, 30, 60]),
)
def test_a_whole_local_day_is_cut_into_exactly_its_real_length(
    day: date, name: str, minutes: int
) -> None:
    """00:00-23:59 of any date: as many slots as fit in its real (23/24/25 h) length."""
    tz = ZoneInfo(name)
    slots = expand(rule(day, start=time(0), end=time(23, 59), minutes=minutes), tz)
    step = timedelta(minutes=minutes)
    start, end = local_instant(day, time(0), tz), local_instant(day, time(23, 59), tz)
    assert len(slots) == (end - start) // step if end > start else not slots
    assert_well_formed(slots, step)
    assert_contiguous(slots, step)


def test_a_calendar_day_that_never_happened_yields_no_duplicate_slots() -> None:
    """Samoa skipped 30 Dec 2011 (UTC-10 -> UTC+14): local 30 Dec 08:00 does not
    exist and must not collide with 31 Dec 08:00."""
    apia = ZoneInfo("Pacific/Apia")
    slots = expand(rule(date(2011, 12, 29), date(2011, 12, 31), time(8), time(9)), apia)
    assert_well_formed(slots, timedelta(minutes=15))
    assert {local_date(s.start_at, apia) for s in slots} == {date(2011, 12, 29), date(2011, 12, 31)}
