"""SPDY/3.1 framing, the server's side, as kubectl's port-forward speaks it (sans-I/O).

kubectl upgrades `POST .../pods/NAME/portforward` to SPDY/3.1 (client-go's spdystream,
moby/spdystream's framer) and opens two streams per local connection: an error stream and a
data stream, paired by their `requestID` header. This is what the kubelet's side of that
needs: frames in and out, header blocks compressed with zlib over SPDY/3's dictionary (one
compression context per direction for the whole connection), replies, data, FIN and pings.
Spec: SPDY Protocol draft 3.1 (chromium.org), sections 2.2-2.6.
"""

from __future__ import annotations

import struct
import zlib
from dataclasses import dataclass

VERSION = 3
SYN_STREAM, SYN_REPLY, RST_STREAM, SETTINGS, PING, GOAWAY, HEADERS, WINDOW_UPDATE = (
    1, 2, 3, 4, 6, 7, 8, 9,
)  # fmt: skip
FLAG_FIN = 0x01

# SPDY/3's header dictionary (draft 3, section 2.6.10.1): these words, each after its length
# as four bytes, then the text below as it is.
_WORDS = (
    "options", "head", "post", "put", "delete", "trace", "accept", "accept-charset",
    "accept-encoding", "accept-language", "accept-ranges", "age", "allow", "authorization",
    "cache-control", "connection", "content-base", "content-encoding", "content-language",
    "content-length", "content-location", "content-md5", "content-range", "content-type",
    "date", "etag", "expect", "expires", "from", "host", "if-match", "if-modified-since",
    "if-none-match", "if-range", "if-unmodified-since", "last-modified", "location",
    "max-forwards", "pragma", "proxy-authenticate", "proxy-authorization", "range", "referer",
    "retry-after", "server", "te", "trailer", "transfer-encoding", "upgrade", "user-agent",
    "vary", "via", "warning", "www-authenticate", "method", "get", "status", "200 OK",
    "version", "HTTP/1.1", "url", "public", "set-cookie", "keep-alive", "origin",
)  # fmt: skip
_TEXT = (
    "100101201202205206300302303304305306307402405406407408409410411412413414415416417502504505"
    "203 Non-Authoritative Information204 No Content301 Moved Permanently400 Bad Request401 "
    "Unauthorized403 Forbidden404 Not Found500 Internal Server Error501 Not Implemented503 "
    "Service UnavailableJan Feb Mar Apr May Jun Jul Aug Sept Oct Nov Dec 00:00:00 Mon, Tue, "
    "Wed, Thu, Fri, Sat, Sun, GMTchunked,text/html,image/png,image/jpg,image/gif,"
    "application/xml,application/xhtml+xml,text/plain,text/javascript,publicprivatemax-age="
    "gzip,deflate,sdchcharset=utf-8charset=iso-8859-1,utf-,*,enq=0."
)
DICTIONARY = b"".join(struct.pack(">I", len(w)) + w.encode() for w in _WORDS) + _TEXT.encode()


class SpdyError(ValueError):
    """The peer sent bytes that are not SPDY/3."""


@dataclass(frozen=True)
class Frame:
    """A frame read: a control frame (`kind` > 0) or a data frame (`kind` == 0)."""

    kind: int
    flags: int
    stream: int = 0
    data: bytes = b""
    headers: dict[str, str] | None = None
    value: int = 0  # RST_STREAM and GOAWAY status, PING id, WINDOW_UPDATE delta

    @property
    def fin(self) -> bool:
        return bool(self.flags & FLAG_FIN)


class Connection:
    """One SPDY connection's framing: feed() what arrived, send what the methods return."""

    def __init__(self) -> None:
        self._buffer = bytearray()
        self._inflate = zlib.decompressobj(zdict=DICTIONARY)
        self._deflate = zlib.compressobj(9, zlib.DEFLATED, 15, zdict=DICTIONARY)

    def feed(self, data: bytes) -> list[Frame]:
        self._buffer += data
        frames = []
        while len(self._buffer) >= 8:
            first, second = struct.unpack_from(">II", self._buffer)
            length = second & 0xFFFFFF
            if len(self._buffer) < 8 + length:
                break
            body = bytes(self._buffer[8 : 8 + length])
            del self._buffer[: 8 + length]
            flags = second >> 24
            if not first & 0x80000000:
                frames.append(Frame(0, flags, first & 0x7FFFFFFF, body))
                continue
            if (first >> 16) & 0x7FFF != VERSION:
                raise SpdyError(f"SPDY version {(first >> 16) & 0x7FFF}, not {VERSION}")
            frames.append(self._control(first & 0xFFFF, flags, body))
        return frames

    def _control(self, kind: int, flags: int, body: bytes) -> Frame:
        if kind == SYN_STREAM:
            stream = struct.unpack_from(">I", body)[0] & 0x7FFFFFFF
            return Frame(kind, flags, stream, headers=self._headers(body[10:]))
        if kind in (SYN_REPLY, HEADERS):
            stream = struct.unpack_from(">I", body)[0] & 0x7FFFFFFF
            return Frame(kind, flags, stream, headers=self._headers(body[4:]))
        if kind in (RST_STREAM, WINDOW_UPDATE, GOAWAY):
            stream, value = struct.unpack_from(">II", body)
            return Frame(kind, flags, stream & 0x7FFFFFFF, value=value)
        if kind == PING:
            return Frame(kind, flags, value=struct.unpack_from(">I", body)[0])
        return Frame(kind, flags, data=body)  # SETTINGS and anything newer: told, not used

    def _headers(self, block: bytes) -> dict[str, str]:
        raw = self._inflate.decompress(block)
        (count,), at, headers = struct.unpack_from(">I", raw), 4, {}
        for _ in range(count):
            (size,) = struct.unpack_from(">I", raw, at)
            name = raw[at + 4 : at + 4 + size].decode()
            at += 4 + size
            (size,) = struct.unpack_from(">I", raw, at)
            headers[name] = raw[at + 4 : at + 4 + size].decode()
            at += 4 + size
        return headers

    def _block(self, headers: dict[str, str]) -> bytes:
        raw = struct.pack(">I", len(headers))
        for name, value in headers.items():
            raw += struct.pack(">I", len(name)) + name.encode()
            raw += struct.pack(">I", len(value)) + value.encode()
        return self._deflate.compress(raw) + self._deflate.flush(zlib.Z_SYNC_FLUSH)

    @staticmethod
    def _control_frame(kind: int, flags: int, body: bytes) -> bytes:
        return struct.pack(">HHI", 0x8000 | VERSION, kind, flags << 24 | len(body)) + body

    def reply(self, stream: int) -> bytes:
        """SYN_REPLY with no headers, as the kubelet accepts each stream."""
        body = struct.pack(">I", stream) + self._block({})
        return self._control_frame(SYN_REPLY, 0, body)

    @staticmethod
    def data(stream: int, payload: bytes, *, fin: bool = False) -> bytes:
        """One DATA frame (at most 16 MiB: the server relays 64 KiB reads)."""
        flags = FLAG_FIN if fin else 0
        return struct.pack(">II", stream, flags << 24 | len(payload)) + payload

    def ping(self, ping_id: int) -> bytes:
        return self._control_frame(PING, 0, struct.pack(">I", ping_id))
