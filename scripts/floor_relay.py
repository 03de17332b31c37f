"""The least a Python relay on uvloop can do, for the benchmarks to measure against: accept,
connect, and move bytes with os.read and os.writev, reading nothing. What it adds over
socat is what any relay written in Python pays; what the tunnel adds over it is the
tunnel's own work.

    .venv/bin/python scripts/floor_relay.py LISTEN_PORT TARGET_PORT

Not a tool: loopback only, no error but a closed connection.
"""

from __future__ import annotations

import asyncio
import os
import socket
import sys

import uvloop


def _relay(loop: asyncio.AbstractEventLoop, one: socket.socket, other: socket.socket) -> None:
    """Both directions; a sink with no room holds its bytes, and its source waits."""

    def close() -> None:
        if one.fileno() < 0:
            return
        for sock in (one, other):
            loop.remove_reader(sock.fileno())
            loop.remove_writer(sock.fileno())
            sock.close()

    def readable(source: int, sink: int, held: bytearray) -> None:
        try:
            data = os.read(source, 262144)
        except BlockingIOError:
            return
        except OSError:
            return close()
        if not data:
            return close()
        try:
            written = os.writev(sink, [data])
        except BlockingIOError:
            written = 0
        except OSError:
            return close()
        if written < len(data):
            held += data[written:]
            loop.remove_reader(source)
            loop.add_writer(sink, writable, source, sink, held)

    def writable(source: int, sink: int, held: bytearray) -> None:
        try:
            del held[: os.write(sink, held)]
        except BlockingIOError:
            return
        except OSError:
            return close()
        if not held:
            loop.remove_writer(sink)
            loop.add_reader(source, readable, source, sink, held)

    for source, sink in ((one.fileno(), other.fileno()), (other.fileno(), one.fileno())):
        loop.add_reader(source, readable, source, sink, bytearray())


async def serve(listen: int, target: int) -> None:
    loop = asyncio.get_running_loop()
    server = socket.create_server(("127.0.0.1", listen), reuse_port=False)
    server.setblocking(False)

    def accept() -> None:
        client, _ = server.accept()
        upstream = socket.create_connection(("127.0.0.1", target))
        for sock in (client, upstream):
            sock.setblocking(False)
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        _relay(loop, client, upstream)

    loop.add_reader(server.fileno(), accept)
    await asyncio.Event().wait()


if __name__ == "__main__":
    uvloop.run(serve(int(sys.argv[1]), int(sys.argv[2])))
