"""tshark (Wireshark's Kafka dissector) and our reader agree, frame by frame, on API keys
and correlation ids: on our own recordings and on real captures from other projects."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from kafkatunnel.verify.calls import FileDecoder, listener_of
from tests.tshark import kafka_frames
from tests.verify.conftest import CAPTURES, ROUTED, SINGLE_FORWARD

pytestmark = [
    pytest.mark.quick,
    pytest.mark.skipif(shutil.which("tshark") is None, reason="tshark not installed"),
]


def _ours(path: Path) -> tuple[list[tuple[int, int, bool]], list[int]]:
    decoder = FileDecoder(str(path), path.read_bytes(), log_frames=True).run()
    assert decoder.frame_log is not None
    listeners = [listener_of(i) for i in decoder.capture.interfaces]
    ports = {int(str(x["tunnel"]).rsplit(":", 1)[1]) for x in listeners if x is not None}
    ports |= {int(call.conn.server.rsplit(":", 1)[1]) for call in decoder.calls}
    ports |= {int(orphan.conn.server.rsplit(":", 1)[1]) for orphan in decoder.orphans}
    return decoder.frame_log, sorted(ports)


def _compare(path: Path) -> int:
    ours, ports = _ours(path)
    theirs = kafka_frames(path, ports)
    assert [(c, r) for _, c, r in ours] == [(c, r) for _, c, r in theirs]
    for (our_key, _, _), (their_key, _, _) in zip(ours, theirs, strict=True):
        if our_key >= 0 and their_key >= 0:  # -1: a response whose request is elsewhere
            assert our_key == their_key
    return len(ours)


@pytest.mark.parametrize("path", sorted(ROUTED.iterdir()), ids=lambda p: p.name[-11:])
def test_our_recordings_decode_alike(path: Path) -> None:
    assert _compare(path) > 10


def test_a_dumpcap_capture_decodes_alike() -> None:
    assert _compare(SINGLE_FORWARD) > 100


@pytest.mark.parametrize(
    "path", sorted(CAPTURES.rglob("*.pcap*")), ids=lambda p: f"{p.parent.name}/{p.name}"
)
def test_real_captures_decode_alike(path: Path) -> None:
    assert _compare(path) >= 1  # two empty lists would agree on nothing
