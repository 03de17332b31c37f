"""Recordings made from a recorded session's frames, replayed through the real recorder:
many copies of one session for verify's benchmark, or a session whose group and
transactional ids are renamed (hostile names) or whose look-ups are left out, for tests.

The sample's ids all share one prefix (`sample-ea59` in the committed routed session); a
copy replaces it in place with a tag of the same length, so every frame stays valid.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from pathlib import Path
from typing import NamedTuple

from kafkatunnel.capture.packets import Capture
from kafkatunnel.capture.recorder import Listener, Recorder
from kafkatunnel.protocol import FrameDecoder
from kafkatunnel.verify.calls import listener_of

GROUP_MARK = b"-g-"  # the sample's group ids read <prefix>-g-<n>


class Conversation(NamedTuple):
    """One connection of a recording: its listener, server address and frames in order."""

    listener: Listener
    server: tuple[str, int]
    frames: list[tuple[bool, bytes]]  # (towards the server, the whole frame)


class Sample(NamedTuple):
    conversations: list[Conversation]
    prefix: bytes  # what every group and transactional id starts with


def read_sample(files: Iterable[Path]) -> Sample:
    """A kafkatunnel recording's connections, frame by frame."""
    flows: dict[tuple[str, int, str, int], Conversation] = {}
    decoders: dict[tuple[tuple[str, int, str, int], bool], FrameDecoder] = {}
    prefix = b""
    for path in files:
        capture = Capture(path.read_bytes())
        for segment in capture.segments():
            found = listener_of(capture.interfaces[segment.interface])
            if found is None:
                raise ValueError(f"{path} is not a kafkatunnel recording")
            node = found["node_id"]
            listener = Listener(node if isinstance(node, int) else None,
                                str(found["advertised"]), str(found["tunnel"]))  # fmt: skip
            to_server = f"{segment.dst}:{segment.dport}" == listener.tunnel
            key = (segment.src, segment.sport, segment.dst, segment.dport)
            if not to_server:
                key = (segment.dst, segment.dport, segment.src, segment.sport)
            flows.setdefault(key, Conversation(listener, (key[2], key[3]), []))
            decoder = decoders.setdefault((key, to_server), FrameDecoder())
            for frame in decoder.feed(segment.payload):
                flows[key].frames.append((to_server, frame))
                if not prefix and GROUP_MARK in frame:
                    at = frame.index(GROUP_MARK)
                    prefix = frame[at - 11 : at]
    return Sample(list(flows.values()), prefix)


def tag_for(copy: int, prefix: bytes) -> bytes:
    """A copy's prefix: as long as the sample's, unique per copy."""
    return f"copy{copy:07d}".encode()[-len(prefix) :].rjust(len(prefix), b"x")


def record_copies(
    directory: Path,
    sample: Sample,
    tags: Iterable[bytes],
    *,
    keep: Callable[[bool, bytes], bool] = lambda to_server, frame: True,
    relisten: Callable[[bytes, Listener], Listener] = lambda tag, listener: listener,
    rotate_bytes: int = 32 * 1024 * 1024,
) -> int:
    """The sample once per tag, each copy on new client ports with its ids renamed to the
    tag. Frames `keep(towards the server, frame)` refuses are left out; `relisten(tag,
    listener)` may say a copy's connections went elsewhere (a tunnel that misroutes).
    Returns how many frames were written."""
    recorder = Recorder(directory, rotate_bytes=rotate_bytes)
    frames = 0
    count = len(sample.conversations)
    for copy, tag in enumerate(tags):
        if len(tag) != len(sample.prefix):
            raise ValueError(f"a tag must be {len(sample.prefix)} bytes long: {tag!r}")
        for index, (listener, server, exchange) in enumerate(sample.conversations):
            port = 10_000 + (copy * count + index) % 50_000
            recording = recorder.connection(relisten(tag, listener), ("127.0.0.2", port), server)
            for to_server, frame in exchange:
                data = frame.replace(sample.prefix, tag)
                if not keep(to_server, data):
                    continue
                (recording.from_client if to_server else recording.to_client)([data])
                frames += 1
            recording.closed()
    recorder.close()
    return frames
