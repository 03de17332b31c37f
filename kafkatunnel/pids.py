"""Process ids and lifetimes: whether a pid is alive (for state files left by crashed runs),
and children that cannot outlive their parent. Stands alone at the top: the tunnel,
kubectl's forwards and the local cluster all start processes."""

from __future__ import annotations

import ctypes
import os
import signal
import subprocess
import sys
from pathlib import Path

PR_SET_PDEATHSIG = 1


def pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True  # alive, owned by someone else
    return True


def die_with_parent() -> None:
    """For preexec_fn: on Linux the kernel kills the child when its parent dies, even by
    SIGKILL, so a killed tunnel leaves no kubectl or forward command behind. Elsewhere a
    no-op (the parent's clean stop still ends its children)."""
    if sys.platform.startswith("linux"):
        ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGKILL)


def ours(pid: int, proc: Path = Path("/proc")) -> bool:
    """Whether `pid` is a kafkatunnel process of this user: what `down` may signal (a pid
    read from a state file may since belong to anyone's anything)."""
    try:
        if proc.is_dir():
            uid = (proc / str(pid)).stat().st_uid
            command = (
                (proc / str(pid) / "cmdline")
                .read_bytes()
                .replace(b"\0", b" ")
                .decode(errors="replace")
            )
        else:  # macOS: no /proc
            out = subprocess.run(["ps", "-o", "uid=,command=", "-p", str(pid)],
                                 capture_output=True, text=True, timeout=5).stdout  # fmt: skip
            uid_text, _, command = out.strip().partition(" ")
            uid = int(uid_text)
    except (OSError, ValueError, subprocess.TimeoutExpired):
        return False
    return uid == os.getuid() and "kafkatunnel" in command
