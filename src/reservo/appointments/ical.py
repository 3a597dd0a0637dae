"""iCalendar (RFC 5545) text of a calendar feed: pure, no I/O.

Written by hand rather than with a library: a feed is a handful of fixed
properties per event, and the three rules that matter are here: TEXT values
escaped (3.3.11), lines folded at 75 octets on character boundaries (3.1), and
CRLF line ends. Every instant is written in UTC (``...Z``), so no VTIMEZONE is
needed and no client has to know the doctor's zone."""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass
from datetime import UTC, datetime

PRODID = "-//reservo//calendar feed//EN"
# How often a subscribed client should poll (Apple and Outlook read these; Google
# polls on its own schedule). Cheap for us: a poll is served from the cache.
REFRESH = "PT15M"
_FOLD_AT = 75  # octets per line, CRLF excluded (RFC 5545 3.1)
# Control characters TEXT may not hold (HTAB is allowed); newlines are escaped first.
_CONTROL = re.compile(r"[\x00-\x08\x0a-\x1f\x7f]")


@dataclass(frozen=True, slots=True)
class Event:
    """One VEVENT: ``uid`` stays the same for an appointment and everything it is
    rescheduled to; ``sequence`` grows with every reschedule and a cancellation."""

    uid: str
    sequence: int
    start: datetime
    end: datetime
    stamp: datetime  # when this version of the event was last changed
    summary: str
    cancelled: bool
    # A prepaid slot's seat held until paid (RFC 5545 STATUS:TENTATIVE).
    tentative: bool = False


def escape(text: str) -> str:
    """A TEXT value: backslash, semicolon and comma escaped, line breaks as \\n,
    other control characters (never meaningful in a name) as spaces."""
    out = text.replace("\\", "\\\\").replace(";", "\\;").replace(",", "\\,")
    out = out.replace("\r\n", "\\n").replace("\n", "\\n").replace("\r", "\\n")
    return _CONTROL.sub(" ", out)


def fold(line: str) -> str:
    """``line`` as one or more physical lines of at most 75 octets each, the
    continuation lines starting with a space; never splits a UTF-8 character."""
    if len(line.encode()) <= _FOLD_AT:
        return line + "\r\n"
    parts: list[str] = []
    current: list[str] = []
    size, limit = 0, _FOLD_AT
    for char in line:
        width = len(char.encode())
        if size + width > limit:
            parts.append("".join(current))
            current, size, limit = [], 0, _FOLD_AT - 1  # the leading space counts
        current.append(char)
        size += width
    parts.append("".join(current))
    return "\r\n ".join(parts) + "\r\n"


def utc(instant: datetime) -> str:
    """DATE-TIME in UTC form (RFC 5545 3.3.5, FORM #2)."""
    return instant.astimezone(UTC).strftime("%Y%m%dT%H%M%SZ")


def _status(e: Event) -> str:
    if e.cancelled:
        return "CANCELLED"
    return "TENTATIVE" if e.tentative else "CONFIRMED"


def calendar(name: str, events: Iterable[Event]) -> bytes:
    """The whole VCALENDAR, UTF-8. No METHOD: a subscribed feed is not an iTIP
    message, and without one DTSTAMP means "last revised", so an unchanged
    event renders to the same bytes (and the feed keeps its ETag)."""
    lines = [
        "BEGIN:VCALENDAR",
        "VERSION:2.0",
        f"PRODID:{PRODID}",
        "CALSCALE:GREGORIAN",
        f"X-WR-CALNAME:{escape(name)}",
        f"REFRESH-INTERVAL;VALUE=DURATION:{REFRESH}",
        f"X-PUBLISHED-TTL:{REFRESH}",
    ]
    for e in events:
        lines += [
            "BEGIN:VEVENT",
            f"UID:{e.uid}",
            f"SEQUENCE:{e.sequence}",
            f"DTSTAMP:{utc(e.stamp)}",
            f"LAST-MODIFIED:{utc(e.stamp)}",
            f"DTSTART:{utc(e.start)}",
            f"DTEND:{utc(e.end)}",
            f"SUMMARY:{escape(e.summary)}",
            f"STATUS:{_status(e)}",
            "TRANSP:OPAQUE",
            "END:VEVENT",
        ]
    lines.append("END:VCALENDAR")
    return "".join(fold(line) for line in lines).encode()
