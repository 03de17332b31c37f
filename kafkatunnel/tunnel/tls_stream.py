"""A TLS stream the relay reads and writes as plaintext, for streams that are not sockets
(an exec'd command's pipes, where OpenSSL has no socket to read; sockets take
tls_socket.py): after the handshake a socketpair stands in for the forwarder's stream, and
a bridge moves bytes between its other end and the TLS records, holding at most
BRIDGE_HELD bytes each way before it stops reading the side that fills it."""

from __future__ import annotations

import asyncio
import contextlib
import os
import socket
import ssl
from collections.abc import Callable

from kafkatunnel.tunnel.certificates import alert_message, openssl_reason
from kafkatunnel.tunnel.forwarders import Upstream

READ_SIZE = 256 << 10
BRIDGE_HELD = 1 << 20  # bytes held for a slow side before the bridge stops reading the other


class TlsUpstream(Upstream):
    """Plaintext on a socketpair for the relay; TLS records on the forwarder's stream."""

    def __init__(
        self, inner: Upstream, tls: ssl.SSLObject, incoming: ssl.MemoryBIO, outgoing: ssl.MemoryBIO
    ) -> None:
        self.inner = inner
        self.tls = tls
        self.version = tls.version() or "TLS"
        self.certificate = tls.getpeercert(binary_form=True)
        self._incoming, self._outgoing = incoming, outgoing
        self._loop = asyncio.get_running_loop()
        ours, self._plain = socket.socketpair()
        ours.setblocking(False)
        self._plain.setblocking(False)
        self._ours = ours
        self.read_fd = self.write_fd = ours.fileno()
        self._to_plain = bytearray()  # decrypted, not yet written to the relay's end
        self._to_broker = bytearray()  # encrypted, not yet written to the forwarder
        self._broker_ended = self._plain_ended = False
        self._failure: str | None = None
        self._watching: set[tuple[int, bool]] = set()
        self._released = False
        inner.on_gone = self._inner_gone
        self._watch(inner.read_fd, False, self._from_broker)
        self._watch(self._plain.fileno(), False, self._from_plain)
        if incoming.pending:  # data that came with the handshake's last flight (TLS 1.3)
            self._loop.call_soon(self._decrypt)

    # -- Upstream ------------------------------------------------------------------------------

    def close(self) -> None:
        with contextlib.suppress(OSError):
            self._ours.shutdown(socket.SHUT_RDWR)
        self.inner.close()

    def release(self) -> None:
        if self._released:
            return
        self._released = True
        for fd, writing in list(self._watching):
            self._unwatch(fd, writing)
        self._ours.close()
        self._plain.close()
        self.inner.release()

    async def wait_closed(self) -> None:
        await self.inner.wait_closed()

    async def why_ended(self, error: OSError | None) -> str | None:
        if self._failure is not None:
            return self._failure
        return await self.inner.why_ended(None)

    def _inner_gone(self) -> None:
        if self.on_gone is not None:
            self.on_gone()

    # -- moving bytes --------------------------------------------------------------------------

    def _from_broker(self) -> None:
        try:
            data = os.read(self.inner.read_fd, READ_SIZE)
        except (BlockingIOError, InterruptedError):
            return
        except OSError as error:
            self._fail(f"connection to the broker lost: {error.strerror}")
            return
        if not data:
            self._incoming.write_eof()
        else:
            self._incoming.write(data)
        self._decrypt()
        if not data:
            self._end_from_broker()

    def _decrypt(self) -> None:
        if self._released:
            return
        while True:
            try:
                chunk = self.tls.read(READ_SIZE)
            except ssl.SSLWantReadError:
                break
            except ssl.SSLZeroReturnError:  # the broker's close_notify
                self._end_from_broker()
                break
            except ssl.SSLError as error:
                if not self._incoming.eof:
                    reason = openssl_reason(error)
                    self._fail(alert_message(reason))
                    # An alert: the far end said no to this client, and will say it again.
                    self.refused = "alert" in reason
                break
            if not chunk:  # SSLObject's word for the broker's close_notify
                self._end_from_broker()
                break
            self._to_plain += chunk
        self._flush_broker()  # a TLS 1.3 KeyUpdate asks for an answer
        self._flush_plain()

    def _end_from_broker(self) -> None:
        if self._broker_ended:
            return
        self._broker_ended = True
        self._unwatch(self.inner.read_fd, False)
        self._flush_plain()

    def _from_plain(self) -> None:
        try:
            data = self._plain.recv(READ_SIZE)
        except (BlockingIOError, InterruptedError):
            return
        except OSError:
            data = b""
        if not data:
            self._plain_ended = True
            self._unwatch(self._plain.fileno(), False)
            with contextlib.suppress(ssl.SSLError):
                self.tls.unwrap()  # close_notify: the broker sees a clean end
            self._to_broker += self._outgoing.read()
            self._flush_broker()
            return
        try:
            self.tls.write(data)
        except ssl.SSLError as error:
            self._fail(f"TLS error towards the broker: {openssl_reason(error)}")
            return
        self._to_broker += self._outgoing.read()
        self._flush_broker()

    def _flush_plain(self) -> None:
        fd = self._plain.fileno()
        while self._to_plain:
            try:
                sent = self._plain.send(self._to_plain)
            except (BlockingIOError, InterruptedError):
                break
            except OSError:  # the relay's end is closed: nobody wants these bytes
                self._to_plain.clear()
                break
            del self._to_plain[:sent]
        self._backpressure(self._to_plain, fd, self.inner.read_fd, self._from_broker,
                           self._flush_plain, self._broker_ended)  # fmt: skip
        if not self._to_plain and self._broker_ended:
            with contextlib.suppress(OSError):
                self._plain.shutdown(socket.SHUT_WR)

    def _flush_broker(self) -> None:
        if self._outgoing.pending:
            self._to_broker += self._outgoing.read()
        fd = self.inner.write_fd
        while self._to_broker:
            try:
                written = os.write(fd, self._to_broker)
            except (BlockingIOError, InterruptedError):
                break
            except OSError as error:
                self._fail(f"connection to the broker lost: {error.strerror}")
                return
            del self._to_broker[:written]
        self._backpressure(self._to_broker, fd, self._plain.fileno(), self._from_plain,
                           self._flush_broker, self._plain_ended)  # fmt: skip

    def _backpressure(
        self,
        held: bytearray,
        sink: int,
        source: int,
        on_source: Callable[[], None],
        on_sink: Callable[[], None],
        source_ended: bool,
    ) -> None:
        """Wait for room in `sink` while bytes are held for it; stop reading `source`
        while more than BRIDGE_HELD are."""
        if held:
            self._watch(sink, True, on_sink)
        else:
            self._unwatch(sink, True)
        if source_ended:
            return
        if len(held) > BRIDGE_HELD:
            self._unwatch(source, False)
        else:
            self._watch(source, False, on_source)

    def _fail(self, reason: str) -> None:
        """The stream is broken: the relay sees its end, and why_ended says why."""
        if self._failure is None:
            self._failure = reason
        self._to_plain.clear()
        self._broker_ended = self._plain_ended = True
        for fd, writing in list(self._watching):
            self._unwatch(fd, writing)
        with contextlib.suppress(OSError):
            self._plain.shutdown(socket.SHUT_RDWR)

    def _watch(self, fd: int, writing: bool, callback: Callable[[], None]) -> None:
        if self._released or (fd, writing) in self._watching:
            return
        self._watching.add((fd, writing))
        if writing:
            self._loop.add_writer(fd, callback)
        else:
            self._loop.add_reader(fd, callback)

    def _unwatch(self, fd: int, writing: bool) -> None:
        if (fd, writing) not in self._watching:
            return
        self._watching.discard((fd, writing))
        if writing:
            self._loop.remove_writer(fd)
        else:
            self._loop.remove_reader(fd)
