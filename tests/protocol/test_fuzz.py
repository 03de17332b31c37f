"""Garbage never raises anything but ProtocolError (10^5 cases: scripts/bench_protocol.py)."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from tests.kio_messages import encode, response_frame, responses
from tests.protocol.fuzz import TARGETS, exercise


@settings(max_examples=3000, deadline=None)
@given(data=st.binary(max_size=200), target=st.integers(0, 10_000), chunk=st.integers(1, 64))
def test_random_bytes(data: bytes, target: int, chunk: int) -> None:
    exercise(data, target, chunk)


@settings(max_examples=1500, deadline=None)
@given(
    draw=st.data(),
    target=st.integers(0, len(TARGETS) - 1),
    cut=st.integers(0, 10_000),
    flip=st.integers(0, 10_000),
    byte=st.integers(0, 255),
)
def test_mutated_valid_messages(
    draw: st.DataObject, target: int, cut: int, flip: int, byte: int
) -> None:
    """Valid responses, truncated and with one byte changed: the hardest garbage."""
    api_key, version = TARGETS[target]
    body = encode(draw.draw(responses(api_key, version)))
    wire = bytearray(response_frame(api_key, version, body)[8:])
    if wire:
        wire[flip % len(wire)] = byte
    exercise(bytes(wire[: cut % (len(wire) + 1)]), target, 7)
