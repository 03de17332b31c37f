"""The DNS shim's sockets: UDP with asyncio-dgram, and TCP (two-byte length prefix), both
answering from one Zone. A bad packet is answered FORMERR (or dropped), counted, and logged
at most every ten seconds; the loop goes on."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import socket

import asyncio_dgram

from kafkatunnel.dns.answer import Reply, respond
from kafkatunnel.dns.names import Zone
from kafkatunnel.ratelimit import RateLimitedLog

log = logging.getLogger("kafkatunnel.dns")


def bind_dns(host: str, port: int) -> tuple[socket.socket, socket.socket]:
    """The shim's UDP and TCP sockets, bound now: port 53 needs root, which the process
    that serves them may since have dropped."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    udp = socket.socket(family, socket.SOCK_DGRAM)
    try:
        udp.bind((host, port))
    except OSError as error:
        udp.close()
        raise OSError(
            error.errno,
            f"cannot serve DNS on {host}:{port} (udp): {error.strerror}; "
            "port 53 needs root (or CAP_NET_BIND_SERVICE), or choose --dns-listen",
        ) from None
    tcp = socket.socket(family, socket.SOCK_STREAM)
    try:
        tcp.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        tcp.bind((host, udp.getsockname()[1]))
        tcp.listen(64)
    except OSError as error:
        udp.close()
        tcp.close()
        raise OSError(
            error.errno, f"cannot serve DNS on {host}:{port} (tcp): {error.strerror}"
        ) from None
    udp.setblocking(False)
    tcp.setblocking(False)
    return udp, tcp


class DnsServer:
    def __init__(
        self,
        zone: Zone,
        host: str = "127.0.0.1",
        port: int = 53,
        sockets: tuple[socket.socket, socket.socket] | None = None,
    ) -> None:
        """sockets: bound already (bind_dns), e.g. while the process was still root."""
        self.zone = zone
        self.host = host
        self.port = port
        self.sockets = sockets
        self.answered = 0
        self.dropped = 0
        self.bad_packets = 0  # malformed, or not a query we serve
        self._bad_log = RateLimitedLog(
            log, "DNS: %d bad packet(s) answered FORMERR/NOTIMP or dropped%s; last: %s"
        )
        self._udp: asyncio_dgram.DatagramServer | None = None
        self._tcp: asyncio.Server | None = None
        self._task: asyncio.Task[None] | None = None

    async def start(self) -> None:
        udp, tcp = self.sockets or bind_dns(self.host, self.port)
        self.sockets = None
        server = await asyncio_dgram.from_socket(udp)  # unconnected: a server
        assert isinstance(server, asyncio_dgram.aio.DatagramServer)
        self._udp = server
        self.port = udp.getsockname()[1]
        self._tcp = await asyncio.start_server(self._serve_tcp, sock=tcp)
        self._task = asyncio.get_running_loop().create_task(self._serve_udp())

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
        if self._udp is not None:
            self._udp.close()
        if self._tcp is not None:
            self._tcp.close()
            await self._tcp.wait_closed()

    async def _serve_udp(self) -> None:
        assert self._udp is not None
        while True:
            try:
                data, peer = await self._udp.recv()
            except asyncio_dgram.TransportClosed:
                return
            except OSError as error:
                # e.g. ECONNREFUSED: an ICMP "port unreachable" for an earlier reply to a
                # client that has gone. It concerns that client only; keep serving.
                log.debug("DNS socket error ignored: %s", error)
                continue
            reply = self._answer(data, udp=True)
            if reply is not None:
                with contextlib.suppress(OSError, asyncio_dgram.TransportClosed):
                    await self._udp.send(reply, peer)

    async def _serve_tcp(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            while True:
                size = int.from_bytes(await asyncio.wait_for(reader.readexactly(2), 10), "big")
                data = await asyncio.wait_for(reader.readexactly(size), 10)
                reply = self._answer(data, udp=False)
                if reply is None:
                    break
                writer.write(len(reply).to_bytes(2, "big") + reply)
                await writer.drain()
        except (TimeoutError, asyncio.IncompleteReadError, ConnectionError):
            pass
        finally:
            writer.close()

    def _answer(self, data: bytes, udp: bool) -> bytes | None:
        try:
            reply = respond(data, self.zone, udp=udp)
        except Exception as error:
            reply = Reply(None, f"broke the answer ({type(error).__name__})")
        if reply.problem is not None:
            self.bad_packets += 1
            self._bad_log.note(reply.problem)
        if reply.packet is None:
            self.dropped += 1
        else:
            self.answered += 1
        return reply.packet
