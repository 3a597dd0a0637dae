"""Kafka administration: topics created, the brokers' readiness, consumer groups' lag."""

from __future__ import annotations

import asyncio
from collections.abc import Iterable, Sequence

import structlog
from aiokafka import AIOKafkaConsumer, TopicPartition
from aiokafka.admin import AIOKafkaAdminClient, NewTopic
from aiokafka.conn import create_conn
from aiokafka.errors import KafkaError
from aiokafka.protocol.metadata import MetadataRequest

log = structlog.get_logger(__name__)

TOPIC_ALREADY_EXISTS = 36


async def ensure_topics(
    bootstrap: str,
    topics: Iterable[str],
    partitions: int,
    replication_factor: int = 1,
    per_topic: dict[str, int] | None = None,
    timeout_ms: int = 10_000,
) -> None:
    """Create missing topics; existing ones are left as they are (partitions are
    never shrunk, and growing them would move keys, so that stays an operator act)."""
    wanted = sorted(set(topics))
    if not wanted:
        return
    per_topic = per_topic or {}
    admin = AIOKafkaAdminClient(bootstrap_servers=bootstrap, request_timeout_ms=timeout_ms)
    await admin.start()
    try:
        response = await admin.create_topics(
            [NewTopic(t, per_topic.get(t, partitions), replication_factor) for t in wanted]
        )
        for topic, code, *rest in response.topic_errors:
            if code not in (0, TOPIC_ALREADY_EXISTS):
                raise KafkaError(f"create topic {topic}: error {code} {rest}")
    finally:
        await admin.close()


async def broker_answers(bootstrap: str, timeout_s: float = 1.0) -> bool:
    """Readiness: does a bootstrap broker answer a metadata request within
    ``timeout_s``? A TCP connect is not enough: a frozen broker's kernel still
    accepts connections. Every bootstrap broker is asked at once, on a connection
    of its own (no client: no background metadata task, no log line per probe)."""
    asks = [asyncio.ensure_future(_ask_metadata(a)) for a in bootstrap.split(",")]
    waiting = set(asks)
    try:
        async with asyncio.timeout(timeout_s):
            while waiting:
                done, waiting = await asyncio.wait(waiting, return_when=asyncio.FIRST_COMPLETED)
                if any(not ask.exception() for ask in done):
                    return True
    except TimeoutError:
        pass
    finally:
        for ask in waiting:
            ask.cancel()
        # Every outcome collected: no task left to warn about its error later.
        await asyncio.gather(*asks, return_exceptions=True)
    return False


async def _ask_metadata(address: str) -> None:
    host, _, port = address.strip().rpartition(":")
    conn = await create_conn(host or "127.0.0.1", int(port), client_id="reservo-readiness")
    try:
        await conn.send(MetadataRequest([]))  # no topic: the broker list, small anywhere
    finally:
        conn.close()


async def group_lag(
    bootstrap: str, groups: dict[str, tuple[str, Sequence[str]]], timeout_ms: int = 2000
) -> dict[str, int | None]:
    """Records each consumer group has not consumed yet: name -> (group id, its
    topics) in, name -> lag out. The lag is the end offset minus the group's
    committed offset, summed over the partitions it has committed on (None: it
    has committed nothing yet). For the console. A client per group asks for its
    committed offsets without joining it (OffsetFetch, which every
    Kafka-protocol broker answers; the admin API's variant is less portable)."""
    lag: dict[str, int | None] = {}
    for name, (group, topics) in groups.items():
        reader = AIOKafkaConsumer(
            bootstrap_servers=bootstrap,
            group_id=group,
            enable_auto_commit=False,
            request_timeout_ms=timeout_ms,
        )
        await reader.start()
        try:
            partitions = [
                TopicPartition(topic, p)
                for topic in topics
                for p in sorted(reader.partitions_for_topic(topic) or ())
            ]
            committed = {tp: await reader.committed(tp) for tp in partitions}
            known = {tp: at for tp, at in committed.items() if at is not None and at >= 0}
            ends = await reader.end_offsets(list(known)) if known else {}
        finally:
            await reader.stop()
        lag[name] = sum(max(0, ends[tp] - at) for tp, at in known.items()) if known else None
    return lag
