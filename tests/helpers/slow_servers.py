"""Hostile destinations on 127.0.0.1 for the outbound-call tests: one that
answers a huge body as fast as it can, and one that trickles its answer a byte
at a time. Threads (one per connection), so neither the event loop of the test
nor a server process under test slows them down, and they count what they did."""

from __future__ import annotations

import select
import socket
import threading
from types import TracebackType

CHUNK = 64 * 1024


class SlowServer:
    """``mode``: ``huge`` sends a 200 with ``size`` body bytes at full speed;
    ``trickle`` sends a 200 head, then one body byte every ``interval_s`` (``size``
    bytes in all); ``smtp`` trickles an SMTP greeting a byte at a time. It counts
    the body bytes the kernel took (``sent``), the connections it got and how
    many were open at once at most."""

    def __init__(self, mode: str, size: int = 600, interval_s: float = 1.0) -> None:
        self.mode, self.size, self.interval_s = mode, size, interval_s
        self.sent = 0
        self.healed = False  # True: every new request gets a 204 at once
        self.answered = 0  # requests answered 204 once healed
        self.connections = 0
        self.open = 0
        self.max_open = 0
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._sock = socket.socket()
        self._sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self._sock.bind(("127.0.0.1", 0))
        self._sock.listen(128)
        self._sock.settimeout(0.2)
        self.port = int(self._sock.getsockname()[1])
        self._thread = threading.Thread(target=self._accept, daemon=True)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}/hook"

    def __enter__(self) -> SlowServer:
        self._thread.start()
        return self

    def __exit__(
        self, t: type[BaseException] | None, e: BaseException | None, tb: TracebackType | None
    ) -> None:
        self._stop.set()
        self._thread.join(5)
        self._sock.close()

    async def __aenter__(self) -> SlowServer:
        return self.__enter__()

    async def __aexit__(
        self, t: type[BaseException] | None, e: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.__exit__(t, e, tb)

    def _accept(self) -> None:
        while not self._stop.is_set():
            try:
                conn, _ = self._sock.accept()
            except TimeoutError:
                continue
            except OSError:
                return
            threading.Thread(target=self._serve, args=(conn,), daemon=True).start()

    def _serve(self, conn: socket.socket) -> None:
        with self._lock:
            self.connections += 1
            self.open += 1
            self.max_open = max(self.max_open, self.open)
        try:
            with conn:
                conn.settimeout(5)
                if self.mode == "smtp":
                    self._drip(conn, b"220 " + b"x" * self.size + b"\r\n")
                    return
                self._read_head(conn)
                if self.healed:
                    conn.sendall(b"HTTP/1.1 204 No Content\r\ncontent-length: 0\r\n\r\n")
                    with self._lock:
                        self.answered += 1
                    return
                head = f"HTTP/1.1 200 OK\r\ncontent-length: {self.size}\r\n\r\n"
                conn.sendall(head.encode())
                if self.mode == "huge":
                    self._flood(conn)
                else:
                    self._drip(conn, b"x" * self.size)
        except OSError:
            pass  # the client hung up: what the limits are for
        finally:
            with self._lock:
                self.open -= 1

    @staticmethod
    def _read_head(conn: socket.socket) -> None:
        data = b""
        while b"\r\n\r\n" not in data:
            got = conn.recv(4096)
            if not got:
                raise ConnectionError("closed before the request's head")
            data += got

    def _flood(self, conn: socket.socket) -> None:
        block = b"x" * CHUNK
        left = self.size
        while left > 0 and not self._stop.is_set():
            n = conn.send(block[: min(CHUNK, left)])
            with self._lock:
                self.sent += n
            left -= n

    def _drip(self, conn: socket.socket, data: bytes) -> None:
        for i in range(len(data)):
            if self._stop.is_set():
                return
            conn.sendall(data[i : i + 1])
            with self._lock:
                self.sent += 1
            # Wait, but notice at once a client that hung up (so ``open`` counts
            # the connections the client still holds).
            readable, _, _ = select.select([conn], [], [], self.interval_s)
            if readable and not conn.recv(4096):
                return
