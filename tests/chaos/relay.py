"""A TCP relay that gives a process on the machine a place in a network lab.

reservo's processes run in the machine's own namespace (where Redis, Kafka and
the fakes listen on loopback); a relay started on a lab host with
``lab.command(host, ...)`` listens on that host's address and connects onward
from it, so a process whose database URL names the relay reaches PostgreSQL
from that host: a partition that cuts the host off cuts the process off too.
Bytes pass as they are, both ways; a connection the network stops carrying
hangs rather than fails, as it would for a process on that host.

    python -m tests.chaos.relay LISTEN_ADDRESS PORT:TARGET:TARGET_PORT ...
"""

from __future__ import annotations

import asyncio
import contextlib
import sys


async def _pipe(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    try:
        while data := await reader.read(65536):
            writer.write(data)
            await writer.drain()
    except OSError:
        pass
    finally:
        writer.close()


def _handler(target: str, port: int):  # type: ignore[no-untyped-def]
    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            up_reader, up_writer = await asyncio.open_connection(target, port)
        except OSError:
            writer.close()
            return
        await asyncio.gather(_pipe(reader, up_writer), _pipe(up_reader, writer))

    return handle


async def main(address: str, routes: list[str]) -> None:
    servers = []
    for route in routes:
        port, target, target_port = route.split(":")
        handler = _handler(target, int(target_port))
        servers.append(await asyncio.start_server(handler, address, int(port)))
    print("relaying", flush=True)  # the caller waits for this line
    await asyncio.gather(*(s.serve_forever() for s in servers))


if __name__ == "__main__":
    with contextlib.suppress(KeyboardInterrupt):
        asyncio.run(main(sys.argv[1], sys.argv[2:]))
