"""The frame decoder: any chunking of a stream gives the same frames; bad sizes are named."""

from __future__ import annotations

import itertools

import pytest
from hypothesis import given
from hypothesis import strategies as st

from kafkatunnel.protocol import FrameDecoder, FrameSizeError, TruncatedFrame, frame

pytestmark = pytest.mark.quick


@given(
    payloads=st.lists(st.binary(max_size=300), max_size=20),
    cuts=st.lists(st.integers(min_value=0, max_value=10_000), max_size=30),
)
def test_any_chunking_yields_the_same_frames(payloads: list[bytes], cuts: list[int]) -> None:
    stream = b"".join(frame(p) for p in payloads)
    points = sorted({c % (len(stream) + 1) for c in cuts} | {0, len(stream)})
    decoder = FrameDecoder()
    frames: list[bytes] = []
    for start, end in itertools.pairwise(points):
        frames.extend(decoder.feed(stream[start:end]))
    assert frames == [frame(p) for p in payloads]
    assert decoder.buffered == 0
    decoder.close()


def test_byte_by_byte() -> None:
    decoder = FrameDecoder()
    out = []
    for byte in frame(b"hello") + frame(b""):
        out += decoder.feed(bytes([byte]))
    assert out == [frame(b"hello"), frame(b"")]


def test_negative_size_is_refused_at_once() -> None:
    decoder = FrameDecoder()
    with pytest.raises(FrameSizeError, match="negative"):
        decoder.feed(b"\xff\xff\xff\xfe")
    with pytest.raises(FrameSizeError):
        decoder.feed(frame(b"ok"))  # a broken stream stays broken


def test_oversized_frame_is_refused_before_it_is_buffered() -> None:
    decoder = FrameDecoder(max_frame_size=1024)
    with pytest.raises(FrameSizeError, match="above the maximum of 1024"):
        decoder.feed((1025).to_bytes(4, "big"))
    assert FrameDecoder(max_frame_size=1024).feed(frame(b"x" * 1024)) == [frame(b"x" * 1024)]


def test_tls_client_hello_is_named() -> None:
    with pytest.raises(FrameSizeError, match="TLS"):
        FrameDecoder().feed(b"\x16\x03\x01\x02\x00\x01\x00\x01\xfc\x03\x03")


def test_stream_ending_mid_frame_is_truncated() -> None:
    decoder = FrameDecoder()
    assert decoder.feed(frame(b"abcdef")[:7]) == []
    with pytest.raises(TruncatedFrame, match="after 3 of the 6 bytes of a frame"):
        decoder.close()


def test_stream_ending_inside_the_size_prefix() -> None:
    decoder = FrameDecoder()
    decoder.feed(b"\x00\x00")
    with pytest.raises(TruncatedFrame, match="2 bytes into a frame's 4-byte size"):
        decoder.close()
