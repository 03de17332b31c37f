"""Child processes that can never outlive the harness.

Each child gets PR_SET_PDEATHSIG (the kernel kills it when its parent dies, even by SIGKILL)
and its own process group (so a stop reaches whatever it spawned). Output is read on a
thread into a bounded log, so readiness is a wait on a line, with a deadline.
"""

from __future__ import annotations

import collections
import contextlib
import os
import re
import signal
import socket
import subprocess
import threading
from collections.abc import Callable, Sequence

from kafkatunnel.pids import die_with_parent
from kafkatunnel.waiting import NeverHolds, wait_for

# What asyncio prints of a task that died and was never awaited: in our own programs' output
# it is a defect whatever else the test saw (tests/conftest.py fails the test it happens in).
UNOBSERVED = "Task exception was never retrieved"
_UNOBSERVED_SEEN: list[ManagedProcess] = []  # the children that printed it, once each


def unobserved_task_errors() -> list[str]:
    """Each child that printed UNOBSERVED since the last call: its name and its output from
    that line on (the traceback asyncio printed with it)."""
    told = []
    for process in _UNOBSERVED_SEEN:
        lines = list(process.lines)
        start = next((n for n, line in enumerate(lines) if UNOBSERVED in line), 0)
        told.append(f"{process.name}:\n" + "\n".join(lines[start : start + 40]))
    _UNOBSERVED_SEEN.clear()
    return told


def _die_with_parent_in_own_group() -> None:  # runs in the child between fork and exec
    die_with_parent()
    os.setsid()


class ManagedProcess:
    """A supervised child with captured output, a readiness wait and a sure stop."""

    def __init__(
        self,
        argv: Sequence[str],
        *,
        name: str,
        env: dict[str, str] | None = None,
        keep_stdin_open: bool = False,
    ) -> None:
        self.name = name
        self.argv = list(argv)
        self.lines: collections.deque[str] = collections.deque(maxlen=2000)
        self._new_line = threading.Condition()
        self.popen = subprocess.Popen(
            self.argv,
            stdin=subprocess.PIPE if keep_stdin_open else subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            env={**os.environ, **(env or {})},
            preexec_fn=_die_with_parent_in_own_group,
        )
        self._reader = threading.Thread(target=self._read, name=f"out-{name}", daemon=True)
        self._reader.start()

    def _read(self) -> None:
        assert self.popen.stdout is not None
        for raw in self.popen.stdout:
            line = raw.decode(errors="replace").rstrip("\n")
            if UNOBSERVED in line and self not in _UNOBSERVED_SEEN:
                _UNOBSERVED_SEEN.append(self)
            with self._new_line:
                self.lines.append(line)
                self._new_line.notify_all()

    @property
    def pid(self) -> int:
        return self.popen.pid

    def alive(self) -> bool:
        return self.popen.poll() is None

    def output(self) -> str:
        return "\n".join(self.lines)

    def wait_for_line(self, pattern: str, *, timeout: float) -> re.Match[str]:
        """The first output line matching `pattern`; fails early if the process exits."""
        regex = re.compile(pattern)

        def find() -> re.Match[str] | None:
            for line in list(self.lines):
                match = regex.search(line)
                if match:
                    return match
            if not self.alive():
                raise NeverHolds(
                    f"{self.name} exited with {self.popen.returncode} before printing "
                    f"/{pattern}/; its output:\n{self.output()}"
                )
            return None

        return wait_for(find, timeout=timeout, what=f"{self.name} to print /{pattern}/")

    def wait_accepting(
        self,
        port: int,
        *,
        timeout: float,
        connect: Callable[[str, int], socket.socket] | None = None,
        hint: str = "",
    ) -> None:
        """Until 127.0.0.1:port accepts a connection (opened by `connect`, e.g. inside a
        network namespace); fails early, with its output, if the process exits."""

        def accepting() -> bool:
            if not self.alive():
                raise NeverHolds(
                    f"{self.name} exited with {self.popen.returncode} before accepting "
                    f"connections on port {port}{hint}; its output:\n{self.output()}"
                )
            if connect is None:
                socket.create_connection(("127.0.0.1", port), timeout=0.5).close()
            else:
                connect("127.0.0.1", port).close()
            return True

        wait_for(accepting, timeout=timeout, what=f"{self.name} to accept on port {port}")

    def stop(self, timeout: float = 5.0) -> None:
        """SIGTERM the process group, SIGKILL it after `timeout`, and reap."""
        if self.popen.stdin:
            with contextlib.suppress(OSError):
                self.popen.stdin.close()
        if self.alive():
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.popen.pid, signal.SIGTERM)
            try:
                self.popen.wait(timeout=timeout)
            except subprocess.TimeoutExpired:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(self.popen.pid, signal.SIGKILL)
                self.popen.wait(timeout=timeout)
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.popen.pid, signal.SIGKILL)  # anything it left in its group
        self._reader.join(timeout=timeout)
