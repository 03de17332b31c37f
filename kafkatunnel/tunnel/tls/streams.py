"""TLS as a byte stream the relay reads and writes as plaintext (see tunnel/streams.py).

- SocketTlsStream: on a socket (a direct connection, a kubectl port-forward's local port, a
  client of --client-tls) OpenSSL reads and writes the socket itself, so every byte costs
  one kernel copy and OpenSSL's cipher, as in a TLS-originating relay written in C (socat's
  OPENSSL address).
- BioTlsStream: on an exec'd command's pipes, where OpenSSL has no socket to read,
  ssl.SSLObject (the standard library's sans-I/O TLS) runs over memory BIOs, and the
  stream moves ciphertext between them and the pipes.

Both directions of a connection share one TLS session: a read may have to wait until the
stream can be written (a TLS 1.3 KeyUpdate's answer) and a write until the far end's bytes
are read (a TLS 1.2 renegotiation); the stream says so (ByteStream._reader_waits_for), and
the event loop, not a timer, wakes it. OpenSSL on a socket reads them in the write itself,
once the socket is readable; over memory BIOs the write waits for the reader's next read,
which takes application data and handshake alike (rather than polling a descriptor nobody
reads while the reading Pump is paused).
OpenSSL may hold decrypted bytes after a read that filled its buffer, which no descriptor
will signal: the stream wakes its reader for them itself.
"""

from __future__ import annotations

import array
import contextlib
import fcntl
import os
import ssl
import termios

from kafkatunnel.protocol import Chunk
from kafkatunnel.tunnel.streams import READ_SIZE, ByteStream, consume

TLS_RECORD = 16 << 10  # the most plaintext one TLS record carries (RFC 8446 5.1)
_FIONREAD = getattr(termios, "FIONREAD", 0x541B)


def join_small(out: list[Chunk]) -> None:
    """Join small chunks at the front of `out` up to a record's size (a frame's header, say:
    not a record of its own; large chunks are not copied). A write that must wait is
    repeated with the same bytes, as OpenSSL requires: once joined, a chunk and the next no
    longer fit a record, so the retry joins nothing."""
    if len(out) > 1 and len(out[0]) < TLS_RECORD:
        ends, size = 1, len(out[0])
        while ends < len(out) and size + len(out[ends]) <= TLS_RECORD:
            size += len(out[ends])
            ends += 1
        if ends > 1:
            out[:ends] = [b"".join(out[:ends])]


class SocketTlsStream(ByteStream):
    """TLS that OpenSSL reads and writes on the socket itself."""

    def __init__(self, tls: ssl.SSLSocket) -> None:
        super().__init__(tls.fileno(), tls.fileno())
        self.tls = tls
        self._count = array.array("i", [0])  # FIONREAD's answer

    def read(self, size: int) -> Chunk | None:
        tls = self.tls
        try:
            first = tls.recv(min(size, TLS_RECORD))
        except ssl.SSLWantReadError:
            return None
        except ssl.SSLWantWriteError:  # OpenSSL must send first (a KeyUpdate's answer)
            self._reader_waits_for((self.write_fd, True))
            return None
        if not first:
            return first
        # OpenSSL gives a record per call: read on while records are there, so that they
        # pass on together, as a socket read's bytes would (allocating what they hold, no
        # more: most answers are one small record). Whether more is there is asked of the
        # kernel (FIONREAD), not learned from a failing read: an SSLWantReadError and its
        # read cost a small answer's round trip about 2 us.
        parts, filled = [first], len(first)
        while filled < size and (tls.pending() or self._arrived()):
            try:
                part = tls.recv(min(size - filled, TLS_RECORD))
            except (ssl.SSLWantReadError, ssl.SSLWantWriteError):
                break  # the next read meets it again, and waits then
            if not part:  # the end: the next read says so again
                break
            parts.append(part)
            filled += len(part)
        if filled == size and self.held():
            self._wake_reader_soon()
        return first if len(parts) == 1 else b"".join(parts)

    def _arrived(self) -> int:
        """Bytes the kernel holds for the socket, unread."""
        fcntl.ioctl(self.read_fd, _FIONREAD, self._count)
        return self._count[0]

    def write(self, out: list[Chunk]) -> bool:
        try:
            while out:
                join_small(out)
                consume(out, self.tls.send(out[0]))
        except ssl.SSLWantWriteError:
            self._writer_waits_for((self.write_fd, True))
            return False
        except ssl.SSLWantReadError:
            # a renegotiation: OpenSSL reads its handshake itself on the next try, once the
            # socket is readable (application data ahead of it fails the write; Kafka
            # brokers never renegotiate)
            self._writer_waits_for((self.read_fd, False))
            return False
        return True

    def held(self) -> bool:
        return not self._closed and self.tls.pending() > 0

    def close_notify(self) -> None:
        """Tell the far end this is a clean end (best effort: the socket may be full)."""
        with contextlib.suppress(OSError, ValueError):
            self.tls.unwrap()


class BioTlsStream(ByteStream):
    """TLS through memory BIOs over two descriptors (an exec'd command's stdout and stdin),
    holding the ciphertext the write descriptor has no room for yet."""

    def __init__(
        self,
        read_fd: int,
        write_fd: int,
        tls: ssl.SSLObject,
        incoming: ssl.MemoryBIO,
        outgoing: ssl.MemoryBIO,
    ) -> None:
        super().__init__(read_fd, write_fd)
        self.tls = tls
        self.incoming, self.outgoing = incoming, outgoing
        self._unsent = bytearray()  # ciphertext not yet written to write_fd

    def read(self, size: int) -> Chunk | None:
        parts: list[bytes] = []
        filled = 0
        ended = False
        try:
            while filled < size:
                try:
                    part = self.tls.read(size - filled)
                except ssl.SSLWantReadError:
                    if not self._take_in():
                        break
                    continue
                except ssl.SSLZeroReturnError:  # the far end's close_notify
                    ended = True
                    break
                except ssl.SSLError:
                    if not self.incoming.eof:  # an alert: the stream's error
                        raise
                    ended = True  # the pipe ended without close_notify: an end all the same
                    break
                if not part:
                    ended = True
                    break
                parts.append(part)
                filled += len(part)
        finally:
            self._send_own()  # a KeyUpdate's answer, an alert
            if self._writer_waits is None:  # a write waited for this read
                self._read_done()
        if parts:
            if filled == size and self.held():
                self._wake_reader_soon()
            return parts[0] if len(parts) == 1 else b"".join(parts)
        return b"" if ended else None

    def _take_in(self) -> bool:
        """Ciphertext from read_fd into OpenSSL: False if there is none yet."""
        try:
            data = os.read(self.read_fd, READ_SIZE)
        except (BlockingIOError, InterruptedError):
            return False
        if data:
            self.incoming.write(data)
        else:
            self.incoming.write_eof()
        return True

    def write(self, out: list[Chunk]) -> bool:
        if not self._send_unsent():
            return False
        while out:
            join_small(out)
            try:
                consume(out, self.tls.write(out[0]))
            except ssl.SSLWantReadError:  # a renegotiation: the reader takes its bytes in
                self._writer_waits_for_reader()
                return False
            self._unsent += self.outgoing.read()
            if not self._send_unsent():
                return False
        return True

    def _send_unsent(self) -> bool:
        """Write held ciphertext: True once none is left."""
        while self._unsent:
            try:
                written = os.write(self.write_fd, self._unsent)
            except (BlockingIOError, InterruptedError):
                return False
            del self._unsent[:written]
        return True

    def _send_own(self) -> None:
        """Send what OpenSSL wrote of its own accord, now or once there is room."""
        if self.outgoing.pending:
            self._unsent += self.outgoing.read()
        try:
            sent = self._send_unsent()
        except OSError:  # the reader meets the broken stream on its next read
            self._unsent.clear()
            sent = True
        if sent == (self._own is not None):  # waits, and need not; or the reverse
            self._own_wait(None if sent else self._send_own)

    def held(self) -> bool:
        return not self._closed and (self.tls.pending() > 0 or self.incoming.pending > 0)

    def close_notify(self) -> None:
        with contextlib.suppress(ssl.SSLError):
            self.tls.unwrap()
        self._unsent += self.outgoing.read()
        with contextlib.suppress(OSError):
            self._send_unsent()
