"""Calendar feeds (RFC 5545) of a patient's appointments and of a doctor's agenda,
behind secret, revocable URLs.

- A link's URL carries a random secret (256 bits). PostgreSQL keeps only its
  SHA-256, one link per owner: a new link replaces the row, which revokes the
  previous URL. A copy of the database opens no feed.
- An event's UID is its reschedule chain's first appointment, and SEQUENCE
  counts the chain's moves (plus one once cancelled): a reschedule updates the
  subscriber's event instead of adding a second one, and the appointment it
  moved away from never shows as a cancelled duplicate.
- A feed is rendered by one statement and kept in Redis (``cache_life_s``) with
  a per-process copy in front (``local_ttl_s``), like the slot lists: every
  booking, cancellation and reschedule of the patient or the doctor drops it
  (``feed_keys``, after its commit and again through the outbox), and so does
  a new link. The cached feed carries the hash of the owner's current link,
  which every request is checked against: a replaced link is refused as soon
  as its owner's entry is dropped.
- Which owner a secret belongs to never changes (a replaced link is refused by
  the check above, not by forgetting its owner), so that mapping is cached long
  and written when the link is made: a poll costs no PostgreSQL statement until
  the owner's feed changes or its entry expires."""

from __future__ import annotations

import hashlib
import hmac
import re
import secrets
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Literal

import structlog

from reservo.appointments import ical, repo
from reservo.appointments.domain import effective_status
from reservo.core.db.database import Database
from reservo.core.kernel.clock import Clock
from reservo.core.kernel.errors import DomainError
from reservo.core.redis.cache import Cache
from reservo.core.redis.local_cache import LocalCache

log = structlog.get_logger(__name__)

Kind = Literal["patient", "doctor"]
# A feed shows appointments from this long ago on, and cancelled ones for this long.
PAST = timedelta(days=30)
# The secret of a link: 32 random bytes, base64url without padding (43 characters).
TOKEN_BYTES = 32
_TOKEN = re.compile(r"[A-Za-z0-9_-]{43}")
# How long Redis and each process keep a secret's owner (never changes, see above).
_OWNER_LIFE_S = 7 * 24 * 3600
_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)


@dataclass(frozen=True)
class FeedLimits:
    url_base: str  # the public base URL the links start with
    cache_life_s: int = 60
    local_ttl_s: float = 1.0
    local_max_entries: int = 4096


def feed_key(kind: Kind, owner_id: int) -> str:
    return f"calendar:{{{kind}:{owner_id}}}"


def feed_keys(patient_id: int, doctor_id: int) -> tuple[str, str]:
    """The cached feeds an appointment of this patient with this doctor is in."""
    return feed_key("patient", patient_id), feed_key("doctor", doctor_id)


def _owner_key(digest: bytes) -> str:
    return f"calendar-owner:{digest.hex()}"


def _digest(token: str) -> bytes:
    return hashlib.sha256(token.encode("ascii")).digest()


def not_found() -> DomainError:
    # One answer for a malformed, unknown and replaced URL: none tells which.
    return DomainError("calendar_not_found", "no calendar at this URL (unknown or revoked link)")


@dataclass(frozen=True, slots=True)
class Feed:
    """A rendered feed as it is cached: the hash of the owner's link it may be
    served for (empty: the owner has none), its validators and its bytes."""

    link: bytes
    etag: str
    last_modified: datetime
    body: bytes

    def encode(self) -> bytes:
        head = f"{self.link.hex()} {self.etag} {self.last_modified.isoformat()}\n"
        return head.encode("ascii") + self.body

    @classmethod
    def decode(cls, raw: bytes) -> Feed:
        """Raises ValueError (UnicodeDecodeError too) on anything ``encode`` did not write."""
        head, newline, body = raw.partition(b"\n")
        link, etag, modified = head.decode("ascii").split(" ")
        if not newline or not etag.startswith('"'):
            raise ValueError("not a cached feed")
        return cls(bytes.fromhex(link), etag, datetime.fromisoformat(modified), body)


class CalendarFeeds:
    def __init__(self, db: Database, clock: Clock, cache: Cache, limits: FeedLimits) -> None:
        self.db, self.clock, self.cache, self.limits = db, clock, cache, limits
        # Registered with the cache: a bump of a feed key drops the copy here too.
        self._feeds: LocalCache[Feed] = cache.local(limits.local_ttl_s, limits.local_max_entries)
        self._owners: LocalCache[tuple[Kind, int] | None] = LocalCache(
            _OWNER_LIFE_S, limits.local_max_entries
        )

    # -- links ------------------------------------------------------------------------

    async def new_link(self, kind: Kind, owner_id: int) -> str:
        """A new secret URL of the owner's feed; the previous one stops working.
        404 ``doctor_not_found`` for a doctor that does not exist."""
        token = secrets.token_urlsafe(TOKEN_BYTES)
        digest = _digest(token)
        async with self.db.transaction() as conn:
            if kind == "doctor" and await repo.get_doctor(conn, owner_id) is None:
                raise DomainError("doctor_not_found", f"no doctor {owner_id}")
            await repo.put_calendar_link(conn, kind, owner_id, digest, self.clock.now())
        # After the commit: the cached feed names the replaced link, so it goes
        # (here, in this process's copy, and for fills already under way). If
        # Redis does not take it, the old URL works until the entry expires.
        await self.cache.bump(feed_key(kind, owner_id))
        await self.cache.set_bytes(_owner_key(digest), f"{kind}:{owner_id}".encode(), _OWNER_LIFE_S)
        return f"{self.limits.url_base.rstrip('/')}/calendars/{token}.ics"

    # -- serving ----------------------------------------------------------------------

    async def feed(self, token: str) -> Feed:
        """The feed the URL's secret opens; 404 ``calendar_not_found`` otherwise."""
        if _TOKEN.fullmatch(token) is None:
            raise not_found()
        digest = _digest(token)
        owner = await self._owner(digest)
        if owner is None:
            raise not_found()
        feed = await self._feed(*owner)
        if not hmac.compare_digest(feed.link, digest):
            raise not_found()  # replaced by a newer link
        return feed

    async def _owner(self, digest: bytes) -> tuple[Kind, int] | None:
        key = digest.hex()

        async def fill() -> tuple[tuple[Kind, int] | None, float]:
            raw, _ = await self.cache.get_bytes(_owner_key(digest))
            if raw is not None:
                owner = _parse_owner(raw)
                if owner is not None:
                    return owner, _OWNER_LIFE_S
            async with self.db.connection() as conn:
                row = await repo.calendar_link_owner(conn, digest)
            if row is None:
                return None, 0.0  # unknown (or replaced and forgotten): nothing kept
            found: tuple[Kind, int] = (row["owner_kind"], row["owner_id"])
            await self.cache.set_bytes(
                _owner_key(digest), f"{found[0]}:{found[1]}".encode(), _OWNER_LIFE_S
            )
            return found, _OWNER_LIFE_S

        owner = self._owners.peek(key)
        return owner if owner is not None else await self._owners.get(key, fill)

    async def _feed(self, kind: Kind, owner_id: int) -> Feed:
        """The owner's feed from this process's copy, else Redis, else one
        statement; a read that raced a change is served but never kept."""
        key = feed_key(kind, owner_id)

        async def fill() -> tuple[Feed, float]:
            raw, life_s, generation = await self.cache.get_versioned(key)
            if raw is not None:
                try:
                    return Feed.decode(raw), life_s
                except ValueError:
                    log.warning("cache.corrupt_entry", key=key)  # a miss, not an outage
            fresh = await self._render(kind, owner_id)
            if generation is None:
                # Redis away: only this process's short copy bounds the reads.
                return fresh, self.limits.local_ttl_s
            life = float(self.limits.cache_life_s)
            stored = await self.cache.set_if_unchanged(key, fresh.encode(), life, generation)
            return fresh, life if stored else 0.0

        feed = self._feeds.peek(key)
        return feed if feed is not None else await self._feeds.get(key, fill)

    async def _render(self, kind: Kind, owner_id: int) -> Feed:
        now = self.clock.now()
        # The primary, not a replica: a replica behind a new link would still
        # open the replaced one.
        async with self.db.connection() as conn:
            rows = await repo.calendar_feed(conn, kind, owner_id, now - PAST)
        return render(kind, rows, now)


def _parse_owner(raw: bytes) -> tuple[Kind, int] | None:
    kind, _, owner_id = raw.decode("ascii", "replace").partition(":")
    if kind == "patient" and owner_id.isdigit():
        return "patient", int(owner_id)
    if kind == "doctor" and owner_id.isdigit():
        return "doctor", int(owner_id)
    log.warning("cache.corrupt_entry", key="calendar-owner")
    return None


def render(kind: Kind, rows: Sequence[repo.Row], now: datetime) -> Feed:
    """The feed of ``repo.calendar_feed``'s rows (the first names the link), as
    it stands at ``now`` (a hold past its end is over)."""
    link = rows[0]["token_sha256"] if rows else None
    events = [_event(kind, r, now) for r in rows if r["id"] is not None]
    name = "Appointments" if kind == "patient" else "Agenda"
    body = ical.calendar(f"reservo: {name}", events)
    stamps = [e.stamp for e in events]
    if link is not None:
        stamps.append(rows[0]["link_created_at"])
    # HTTP dates have whole seconds: a later change in the same second is still
    # told apart by the ETag, which clients send first.
    modified = max(stamps, default=_EPOCH).astimezone(UTC).replace(microsecond=0)
    etag = f'"{hashlib.sha256(body).hexdigest()[:32]}"'
    return Feed(bytes(link) if link is not None else b"", etag, modified, body)


def _event(kind: Kind, r: repo.Row, now: datetime) -> ical.Event:
    # An unpaid hold that ended (EXPIRED, flipped or not yet) is cancelled too;
    # a hold's payment (settled_at) is a change of the event: TENTATIVE -> CONFIRMED.
    status = effective_status(r["status"], r["hold_expires_at"], now)
    cancelled = status in ("CANCELLED", "EXPIRED")
    settled = r["settled_at"]
    # Only what the owner may see: the doctor's name for a patient; for the
    # doctor, the patient's id (as the agenda shows it), never more.
    if kind == "patient":
        summary = f"Appointment with {r['doctor_name']}"
    else:
        summary = f"Appointment: patient #{r['patient_id']}"
    return ical.Event(
        uid=f"appointment-{r['root']}@reservo",
        sequence=r["depth"] + int(cancelled) + int(settled is not None),
        start=r["start_at"],
        end=r["end_at"],
        stamp=(r["cancelled_at"] or settled or r["created_at"])
        if cancelled
        else (settled or r["created_at"]),
        summary=summary,
        cancelled=cancelled,
        tentative=status == "HELD",
    )
