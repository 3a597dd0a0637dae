"""The one rule for a time zone name: an IANA zone both Python and PostgreSQL know.

A zone is stored (doctors, recurring jobs) and then read by both sides: Python
expands local times with ``zoneinfo``, PostgreSQL computes local dates with
``AT TIME ZONE``. A name only one of them knows is accepted today and breaks a
background loop tomorrow, so every intake (body or query) takes its zone through
this rule, and a stored row that breaks it anyway (written before the rule) is
parked by the loop that meets it (core.messaging.poison).

The set is Python's installed tz database minus the keys that are files of the
database but name no place, and that a PostgreSQL built with its own copy of the
database does not have. tests/integration/test_timezones.py checks it against
``pg_timezone_names``, so the two cannot drift apart unnoticed."""

from __future__ import annotations

import zoneinfo
from functools import lru_cache
from typing import Annotated

from pydantic import AfterValidator, Field

# "localtime" is the machine's own zone (differs per host), "Factory" a
# placeholder, "posixrules" a template; posix/* and right/* are copies of the
# database (right/* with leap seconds, which PostgreSQL does not model).
_NOT_ZONES = frozenset({"localtime", "Factory", "posixrules"})
_NOT_ZONE_DIRS = ("posix/", "right/")
# Longer than any IANA name (the longest is 32 characters): a bound for intake.
MAX_ZONE_LENGTH = 64


class UnknownZone(ValueError):
    """A name that is not an accepted time zone."""


@lru_cache(maxsize=1)
def zone_names() -> frozenset[str]:
    """Every accepted zone name, computed once per process."""
    return frozenset(
        name
        for name in zoneinfo.available_timezones()
        if name not in _NOT_ZONES and not name.startswith(_NOT_ZONE_DIRS)
    )


def check_zone(name: str) -> str:
    """``name`` when it is an accepted zone; UnknownZone otherwise."""
    if name not in zone_names():
        raise UnknownZone(f"unknown time zone {name!r}: give an IANA name such as Europe/Paris")
    return name


def zone(name: str) -> zoneinfo.ZoneInfo:
    """The accepted zone ``name``; UnknownZone for anything else (a path, a typo,
    an abbreviation that is not a zone key, a zone PostgreSQL may not know)."""
    check_zone(name)
    try:
        return zoneinfo.ZoneInfo(name)
    except (zoneinfo.ZoneInfoNotFoundError, ValueError) as exc:
        # Listed, yet unreadable (the tz files changed under the process).
        raise UnknownZone(f"time zone {name!r} cannot be read: {exc}") from exc


# A zone in a request (body field or query parameter): 422 validation_error naming
# the field when the rule refuses it.
Zone = Annotated[
    str,
    Field(min_length=1, max_length=MAX_ZONE_LENGTH, examples=["Europe/Paris"]),
    AfterValidator(check_zone),
]
