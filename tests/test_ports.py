"""Ports picked for a later bind come from below the kernel's ephemeral range, where no
connect() or bind(0) takes them in between, and each run of a test suite's workers from a
slice of its own."""

from __future__ import annotations

import socket

import pytest

from kafkatunnel.demo import ports

pytestmark = pytest.mark.quick


def test_picked_ports_are_below_the_ephemeral_range() -> None:
    ephemeral_low = int(ports.EPHEMERAL_RANGE.read_text().split()[0])
    for _ in range(50):
        base = ports.free_port_run(8)
        assert base >= ports.LOWEST and base + 8 <= ephemeral_low


def test_a_port_in_use_is_not_picked(monkeypatch: pytest.MonkeyPatch) -> None:
    whole = ports.below_ephemeral_slice(0, 1)
    base = next(
        b for b in range(whole.start, whole.stop) if ports._all_free(range(b, b + 3), "127.0.0.1")
    )
    monkeypatch.setattr(ports, "_picker", ports._Picker(range(base, base + 3)))
    with socket.socket() as held:
        held.bind(("127.0.0.1", base + 1))
        picked = {ports.free_port() for _ in range(6)}
        with pytest.raises(RuntimeError, match="no run of 2 free ports"):
            ports.free_port_run(2)  # each run of two holds base+1 or goes past the range
    assert picked == {base, base + 2}, (base, picked)
    assert ports.free_port_run(2) in (base, base + 1)  # free again once given back


def test_a_run_does_not_go_past_its_range(monkeypatch: pytest.MonkeyPatch) -> None:
    whole = ports.below_ephemeral_slice(0, 1)
    ten = range(whole.stop - 10, whole.stop)
    monkeypatch.setattr(ports, "_picker", ports._Picker(ten))
    for _ in range(20):
        base = ports.free_port_run(4)
        assert ten.start <= base and base + 4 <= ten.stop


def test_the_slices_of_the_workers_do_not_overlap() -> None:
    slices = [set(ports.below_ephemeral_slice(i, 4)) for i in range(4)]
    whole = set(ports.below_ephemeral_slice(0, 1))
    assert all(len(s) > 1_000 and s <= whole for s in slices)
    assert all(not (a & b) for i, a in enumerate(slices) for b in slices[i + 1 :])
