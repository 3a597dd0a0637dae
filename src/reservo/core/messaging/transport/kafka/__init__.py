"""Kafka transport: the outbox relay publishes, consumer-group runners consume.

Publishing (``KafkaTransport``): every claimed outbox row becomes one record on
its aggregate's stream (``<module>.<aggregate>.v1``, core/kernel/contract.py), keyed by
``event.key`` (the aggregate id, so one aggregate stays ordered in one
partition), on the CloudEvents Kafka binding in binary mode (envelope.py). A
batch is sent as a whole (send all, then await all acknowledgements) and a row
is reported delivered only once the broker acked its record (``acks=all``).
aiokafka keeps at most one batch in flight per partition, so a retried batch
cannot overtake a later one: per-key order holds even without the idempotent
producer (which Tansu's in-memory store does not support).

Consuming (``KafkaConsumerRunner``): one consumer group per consumer name
(``<prefix>.<consumer>``) calls the SAME handlers the local transport calls.
Records of one key (one aggregate) are handled in offset order; different keys,
in one partition or in several, concurrently (core.messaging.ordering). Kafka orders a
whole partition, but the only order the events promise is per aggregate, and one
handler transaction per record is commit-latency bound. A partition's offset is
committed only up to its first record not finished (the handlers' transactions
committed), so a record is never skipped. A topic with a batch handler gets
each partition's fetched records in one call (one transaction for up to
``max_records`` events: the per-event commit is what limits a consumer
otherwise); when that call fails the records are replayed one by one. A record
whose handler fails transiently (a dependency away: core.messaging.failures) is retried a
few times at once, then the partition waits with a growing backoff (capped) and
reads it again, for as long as the outage lasts; a record the handler rejects
(a permanent failure) is parked at once (``dead_letter`` table, plus
``<topic>.dlt`` when enabled) and the partition moves on. Crash before the
commit means redelivery; handlers dedupe.
"""

from reservo.core.messaging.transport.kafka.admin import broker_answers, ensure_topics, group_lag
from reservo.core.messaging.transport.kafka.consumer import KafkaConsumerRunner
from reservo.core.messaging.transport.kafka.producer import KafkaTransport

__all__ = ["KafkaConsumerRunner", "KafkaTransport", "broker_answers", "ensure_topics", "group_lag"]
