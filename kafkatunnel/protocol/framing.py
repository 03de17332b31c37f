"""Splitting a TCP byte stream into Kafka frames (a 4-byte big-endian size, then that many
bytes), whatever the chunking. Frames are returned whole, size prefix included, so a frame
that needs no change is written on unchanged."""

from __future__ import annotations

from kafkatunnel.protocol.errors import FrameSizeError, TruncatedFrame

DEFAULT_MAX_FRAME_SIZE = 100 * 1024 * 1024  # the broker's socket.request.max.bytes
SIZE_PREFIX = 4


class FrameDecoder:
    """Incremental decoder: `feed` chunks, get whole frames; `close` at end of stream."""

    def __init__(self, max_frame_size: int = DEFAULT_MAX_FRAME_SIZE) -> None:
        self.max_frame_size = max_frame_size
        self._buffer = bytearray()
        self._error: FrameSizeError | None = None

    @property
    def buffered(self) -> int:
        """Bytes held that do not yet make a whole frame."""
        return len(self._buffer)

    def feed(self, data: bytes | bytearray | memoryview) -> list[bytes]:
        """Frames completed by `data`, in order, each with its size prefix."""
        if self._error is not None:
            raise self._error
        buffer = self._buffer
        buffer += data
        frames: list[bytes] = []
        start = 0
        available = len(buffer)
        while available - start >= SIZE_PREFIX:
            size = int.from_bytes(buffer[start : start + SIZE_PREFIX], "big", signed=True)
            if size < 0 or size > self.max_frame_size:
                self._error = FrameSizeError(
                    f"frame size {size} is "
                    + ("negative" if size < 0 else f"above the maximum of {self.max_frame_size}")
                    + " (not a Kafka stream, or a TLS/SASL peer talking to a plaintext port?)"
                )
                raise self._error
            end = start + SIZE_PREFIX + size
            if end > available:
                break
            frames.append(bytes(buffer[start:end]))
            start = end
        if start:
            del buffer[:start]
        return frames

    def close(self) -> None:
        """Declare the end of the stream; raises TruncatedFrame if a frame was cut short."""
        held = len(self._buffer)
        if not held:
            return
        if held < SIZE_PREFIX:
            where = f"{held} bytes into a frame's 4-byte size"
        else:
            size = int.from_bytes(self._buffer[:SIZE_PREFIX], "big", signed=True)
            where = f"after {held - SIZE_PREFIX} of the {size} bytes of a frame"
        self._buffer.clear()
        raise TruncatedFrame(f"the stream ended {where}")


def frame(payload: bytes | bytearray) -> bytes:
    """Prefix `payload` with its size."""
    return len(payload).to_bytes(SIZE_PREFIX, "big") + payload
