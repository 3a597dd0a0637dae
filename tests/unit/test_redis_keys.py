"""Every Redis script and multi-key command keeps to one cluster slot: the keys
one script touches share a hash tag. Checked on the key names (no I/O)."""

from __future__ import annotations

from redis.crc import key_slot

from reservo.core.redis.cache import Cache
from reservo.core.redis.client import RedisGate, make_client
from reservo.core.redis.ratelimit import rate_key
from reservo.rentals.service import search_day_group
from reservo.scheduler.domain import Keys


def slot(key: str) -> int:
    return key_slot(key.encode())


def test_each_scheduler_script_touches_one_slot() -> None:
    k = Keys("reservo")
    for category, urgency in [("http", 0), ("appointments.reminder", 5), ("a.b", 9)]:
        tag = slot(k.future(category, urgency))
        # LOAD (future, queue, known), MOVE (future, queue), TAKE and REQUEUE
        # (queue, processing), ACK (processing, known).
        assert {
            slot(k.queue(category, urgency)),
            slot(k.known(category, urgency)),
            slot(k.processing(category, urgency, "exec-host-1-abc")),
            slot(k.processing(category, urgency, "exec-host-2-def")),
        } == {tag}
    # Different (category, urgency) pairs are free to spread over the cluster.
    assert slot(k.queue("http", 0)) != slot(k.queue("http", 1))


def test_cache_and_rate_keys_are_tagged_by_what_they_count() -> None:
    cache = Cache(RedisGate(make_client("redis://keys.invalid:6379/0", 1.0)), "reservo")
    # A slot list's tag is its doctor, a full mark's its slot, a rate counter's
    # its scope and subject.
    days = [cache.value_key(f"slots:{{doctor:7}}:2026-01-0{d}") for d in range(1, 8)]
    assert {slot(d) for d in days} == {slot("{doctor:7}")}
    assert slot(cache.mark_key("full:{slot:42}")) == slot("{slot:42}")
    # A car search page and the generations of its days (one script) share the city's.
    page = cache.value_key("rentals:avail:{city:Hanoi}:2026-01-01T10:00:00+00:00:50:")
    days = [cache.generation_key(search_day_group("Hanoi", f"2026-01-0{d}")) for d in (1, 2)]
    assert {slot(page), *(slot(d) for d in days)} == {slot("{city:Hanoi}")}
    assert rate_key("book", 9) == "reservo:rl:{book:9}"
    assert slot(rate_key("book", 9)) == slot("{book:9}")
