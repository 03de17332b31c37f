"""Ports picked now and bound seconds later (a tunnel's --listen, an API server, a Spark
master), by this process or one it starts.

A port the kernel handed out for `bind(port 0)` is in its ephemeral range
(`ip_local_port_range`, 32768-60999 by default): between the pick and the bind, the kernel
may give it again, as the source port of any connect() or to another bind(0), and the bind
then fails. So ports are picked below that range, where the kernel never hands one out on its
own, going round a range of this process's (`pick_from`: the test run gives each of its
workers its own, so two workers never pick alike); each is checked free when picked."""

from __future__ import annotations

import random
import socket
import threading
from pathlib import Path

LOWEST = 10_000  # below: ports many services take by convention
EPHEMERAL_RANGE = Path("/proc/sys/net/ipv4/ip_local_port_range")


def _below_ephemeral() -> range:
    """LOWEST up to the kernel's ephemeral range (32768 when it cannot be read)."""
    try:
        ephemeral_low = int(EPHEMERAL_RANGE.read_text().split()[0])
    except (OSError, ValueError, IndexError):
        ephemeral_low = 32_768
    return range(LOWEST, max(ephemeral_low, LOWEST + 1_000))


class _Picker:
    """Goes round `ports`, from a random place (two processes without their own ranges
    seldom start alike), giving runs of ports free when asked (one thread at a time: two
    threads of a test must not be given one run)."""

    def __init__(self, ports: range) -> None:
        self.ports = ports
        self.next = random.randrange(ports.start, ports.stop)
        self.turn = threading.Lock()

    def run(self, count: int, host: str) -> int:
        with self.turn:
            return self._run(count, host)

    def _run(self, count: int, host: str) -> int:
        for _ in range(len(self.ports)):
            base = self.next
            if base + count > self.ports.stop:
                base = self.ports.start
            self.next = base + count
            if _all_free(range(base, base + count), host):
                return base
        raise RuntimeError(f"no run of {count} free ports in {self.ports} on {host}")


_picker = _Picker(_below_ephemeral())


def pick_from(ports: range) -> None:
    """Pick this process's ports from `ports` from now on (part of the range below the
    ephemeral one that no other process picks from)."""
    global _picker
    _picker = _Picker(ports)


def below_ephemeral_slice(index: int, slices: int) -> range:
    """Slice `index` of `slices` equal parts of the ports below the ephemeral range."""
    whole = _below_ephemeral()
    size = len(whole) // slices
    start = whole.start + index * size
    return range(start, start + size)


def _all_free(ports: range, host: str) -> bool:
    held: list[socket.socket] = []
    try:
        for port in ports:
            s = socket.socket()
            held.append(s)
            s.bind((host, port))
        return True
    except OSError:
        return False
    finally:
        for s in held:
            s.close()


def free_port(host: str = "127.0.0.1") -> int:
    """A port free now, to be bound soon."""
    return _picker.run(1, host)


def free_port_run(count: int, host: str = "127.0.0.1") -> int:
    """A port P such that P .. P+count-1 are all free now: a tunnel's bootstrap port and the
    broker ports that follow it."""
    return _picker.run(count, host)
