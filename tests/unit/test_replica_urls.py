"""RESERVO_DATABASE_REPLICA_URLS: several URLs, any of which may name several
hosts (the HA set's nodes, a standby preferred)."""

from __future__ import annotations

from reservo.settings import Settings

HA = (
    "postgresql://postgres@10.0.0.1:5432,10.0.0.2:5432,10.0.0.3:5432/reservo"
    "?target_session_attrs=prefer-standby"
)


def test_a_multi_host_url_is_one_replica() -> None:
    assert Settings(database_replica_urls=HA).replica_urls == [HA]


def test_urls_are_split_where_each_starts() -> None:
    urls = f"postgres://r1:5432/reservo, {HA},postgresql://r2/reservo"
    assert Settings(database_replica_urls=urls).replica_urls == [
        "postgres://r1:5432/reservo",
        HA,
        "postgresql://r2/reservo",
    ]
    assert Settings(database_replica_urls=" ").replica_urls == []
