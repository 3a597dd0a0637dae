"""The outside world of the chaos suite: an SMTP server, a payment gateway and a
job-callback receiver, each recording what it received and able to refuse
connections for a while (it stops listening: a client gets "connection refused").

They run in threads of the test process (aiosmtpd's controller thread, a
threading HTTP server), so the load generator's event loop never slows them down."""

from __future__ import annotations

import contextlib
import json
import threading
import time
from collections import Counter
from dataclasses import dataclass, field
from email import message_from_bytes
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from aiosmtpd.controller import Controller
from aiosmtpd.smtp import SMTP, Envelope, Session

from tests.helpers.procs import free_port


@dataclass
class Mail:
    message_id: str
    event_id: str
    to: str
    subject: str
    body: str


class _MailHandler:
    def __init__(self, box: SmtpRecorder) -> None:
        self.box = box

    async def handle_DATA(self, server: SMTP, session: Session, envelope: Envelope) -> str:
        raw = envelope.original_content or b""
        msg = message_from_bytes(raw)
        payload = msg.get_payload(decode=True)
        body = payload.decode(errors="replace") if isinstance(payload, bytes) else str(payload)
        self.box.record(
            Mail(
                message_id=str(msg["Message-ID"]),
                event_id=str(msg["X-Reservo-Event-Id"]),
                to=str(msg["To"]),
                subject=str(msg["Subject"]),
                body=body,
            )
        )
        return "250 OK"


class SmtpRecorder:
    """Accepts every message (250) and keeps it; ``refuse()`` closes the listener."""

    def __init__(self) -> None:
        self.port = free_port()
        self.mails: list[Mail] = []
        self._lock = threading.Lock()
        self._controller: Controller | None = None

    def record(self, mail: Mail) -> None:
        with self._lock:
            self.mails.append(mail)

    def snapshot(self) -> list[Mail]:
        with self._lock:
            return list(self.mails)

    def listen(self) -> None:
        if self._controller is not None:
            return
        # A new controller each time: a stopped one does not start again cleanly.
        controller = Controller(_MailHandler(self), hostname="127.0.0.1", port=self.port)
        for _ in range(50):  # the port may linger for a moment after a stop
            try:
                controller.start()
                break
            except (OSError, RuntimeError):
                time.sleep(0.1)
        else:
            controller.start()
        self._controller = controller

    def refuse(self) -> None:
        if self._controller is not None:
            self._controller.stop()
            self._controller = None


@dataclass
class Call:
    path: str
    key: str
    body: Any


@dataclass
class HttpRecorder:
    """A tiny HTTP server answering 200 ``{"id": ...}`` to every POST and recording
    (path, Idempotency-Key, JSON body). ``refuse()`` closes the listening socket."""

    name: str
    port: int = field(default_factory=free_port)
    calls: list[Call] = field(default_factory=list)
    # Where it listens: a lab host (tests/chaos/netns.py) reaches it at the lab gateway.
    host: str = "127.0.0.1"

    def __post_init__(self) -> None:
        self._lock = threading.Lock()
        self._server: ThreadingHTTPServer | None = None
        self._thread: threading.Thread | None = None

    def snapshot(self) -> list[Call]:
        with self._lock:
            return list(self.calls)

    def keys(self, prefix: str = "/") -> Counter[str]:
        return Counter(c.key for c in self.snapshot() if c.path.startswith(prefix))

    def listen(self) -> None:
        if self._server is not None:
            return
        recorder = self

        class Handler(BaseHTTPRequestHandler):
            # HTTP/1.0: one request per connection, so while the listener is closed
            # no kept-alive connection still reaches us.
            protocol_version = "HTTP/1.0"

            def do_POST(self) -> None:
                length = int(self.headers.get("Content-Length") or 0)
                raw = self.rfile.read(length) if length else b""
                if len(raw) < length:
                    # The caller died mid-request (a SIGKILLed worker): a real
                    # server never sees a whole request, so nothing happened.
                    self.close_connection = True
                    return
                try:
                    body = json.loads(raw) if raw else None
                except ValueError:
                    body = raw.decode(errors="replace")
                key = self.headers.get("Idempotency-Key") or ""
                with recorder._lock:
                    recorder.calls.append(Call(self.path, key, body))
                out = json.dumps({"id": f"{recorder.name}-{key}"}).encode()
                # The caller may be gone (killed after sending): the effect happened
                # anyway, as at a real provider whose reply is lost.
                with contextlib.suppress(OSError):
                    self.send_response(200)
                    self.send_header("Content-Type", "application/json")
                    self.send_header("Content-Length", str(len(out)))
                    self.end_headers()
                    self.wfile.write(out)

            def log_message(self, format: str, *args: Any) -> None:
                return None

        server: ThreadingHTTPServer | None = None
        for _ in range(50):
            try:
                server = ThreadingHTTPServer((self.host, self.port), Handler)
                break
            except OSError:
                time.sleep(0.1)
        if server is None:
            server = ThreadingHTTPServer((self.host, self.port), Handler)
        server.daemon_threads = True
        self._server = server
        self._thread = threading.Thread(target=server.serve_forever, daemon=True)
        self._thread.start()

    def refuse(self) -> None:
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
            self._server = None
        if self._thread is not None:
            self._thread.join(5)
            self._thread = None
