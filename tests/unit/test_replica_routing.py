"""The read replicas' lag bound and choice, without I/O (the real standby is in
tests/integration/test_read_replicas.py)."""

from __future__ import annotations

import time

import pytest
from pydantic import ValidationError

from reservo.core.db.replicas import Replicas, sampled_before
from reservo.settings import Settings

SAMPLES = [(10.0, 100), (10.5, 100), (11.0, 250), (11.5, 400)]


def test_a_replica_holds_the_newest_sample_it_replayed_past() -> None:
    assert sampled_before(SAMPLES, 400) == 11.5  # in step
    assert sampled_before(SAMPLES, 900) == 11.5  # ahead of the last sample: still only it
    assert sampled_before(SAMPLES, 399) == 11.0
    assert sampled_before(SAMPLES, 100) == 10.5  # an idle primary is no lag
    assert sampled_before(SAMPLES, 99) is None  # behind everything still remembered
    assert sampled_before([], 500) is None


def replicas(n: int, max_lag_s: float = 2.0) -> Replicas:
    dsns = [f"postgresql://u@replica{i}/db" for i in range(n)]
    return Replicas(dsns, max_lag_s=max_lag_s, probe_interval_s=0.5, timeout_s=1.0)


def test_reads_go_to_replicas_within_the_bound_in_turn() -> None:
    rs = replicas(3)
    now = time.monotonic()
    a, b, c = rs.members
    a.up, a.caught_up_at = True, now - 0.4
    b.up, b.caught_up_at = True, now - 1.9
    c.up, c.caught_up_at = True, now - 2.5  # past the bound
    picked = {rs.pick().name for _ in range(10)}  # type: ignore[union-attr]
    assert picked == {"replica0", "replica1"}
    b.up = False  # a probe or a read found it down
    assert {rs.pick().name for _ in range(4)} == {"replica0"}  # type: ignore[union-attr]
    a.caught_up_at = now - 5
    assert rs.pick() is None  # every replica behind: the primary


def test_a_replica_never_probed_serves_nothing() -> None:
    rs = replicas(1)
    rs.members[0].up = True
    assert rs.pick() is None
    assert rs.status() == [{"name": "replica0", "up": True, "lagSeconds": None, "serving": False}]


def test_replica_urls_are_comma_separated_and_the_probe_fits_the_bound() -> None:
    s = Settings(database_replica_urls=" postgresql://a/x , postgresql://b/x,")
    assert s.replica_urls == ["postgresql://a/x", "postgresql://b/x"]
    assert Settings().replica_urls == []
    with pytest.raises(ValidationError, match="PROBE_INTERVAL"):
        Settings(replica_max_lag_s=1.0, replica_probe_interval_s=0.6)
