"""The console's per-consumer lag with Kafka: end offsets minus what each group
committed, read from a real Kafka-protocol broker."""

from __future__ import annotations

import uuid

from aiokafka import AIOKafkaConsumer, AIOKafkaProducer, TopicPartition
from aiokafka.structs import OffsetAndMetadata

from reservo.core.messaging.transport.kafka import ensure_topics, group_lag


async def test_lag_is_what_each_group_has_not_committed(kafka_bootstrap: str) -> None:
    topic = f"console-lag-{uuid.uuid4().hex[:8]}"
    await ensure_topics(kafka_bootstrap, [topic], partitions=1)
    producer = AIOKafkaProducer(bootstrap_servers=kafka_bootstrap, enable_idempotence=False)
    await producer.start()
    try:
        for i in range(10):
            await producer.send_and_wait(topic, f"event {i}".encode(), key=b"k")
    finally:
        await producer.stop()

    group = f"console-lag-group-{uuid.uuid4().hex[:8]}"
    consumer = AIOKafkaConsumer(
        bootstrap_servers=kafka_bootstrap, group_id=group, enable_auto_commit=False
    )
    await consumer.start()
    try:
        tp = TopicPartition(topic, 0)
        consumer.assign([tp])
        await consumer.commit({tp: OffsetAndMetadata(4, "")})
    finally:
        await consumer.stop()

    idle = f"console-lag-idle-{uuid.uuid4().hex[:8]}"
    lag = await group_lag(kafka_bootstrap, {"reader": (group, [topic]), "idle": (idle, [topic])})
    assert lag == {"reader": 6, "idle": None}
