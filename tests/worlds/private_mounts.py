"""A mount namespace of a test world's own, for daemons that write machine-wide paths
whatever they are told: the kubelet's /var/lib/kubelet/device-plugins and
/var/log/containers (constants in its source, `--root-dir` notwithstanding), its volume
plugins' /usr/libexec/kubernetes, containerd's /opt/containerd and its shims' sockets in
/run/containerd/s, libcni's /var/lib/cni.

Inside, the nearest existing directory above each of those paths (/var/lib, /var/log, /opt,
/usr/libexec, /run) is an overlay of itself whose writes land in the world's own directory:
the daemons see the machine as it is, the machine never sees what they wrote, and what they
mounted inside goes with the namespace when its last process exits. Host mounts propagate
in (the namespace is a slave of the host's), never out.
"""

from __future__ import annotations

import shlex
from collections.abc import Iterable, Sequence
from pathlib import Path

from kafkatunnel.demo.processes import ManagedProcess

# What a kubelet and containerd write outside the directories their flags name.
MACHINE_PATHS = (
    Path("/var/lib/kubelet"),
    Path("/usr/libexec/kubernetes"),
    Path("/var/log/containers"),
    Path("/var/lib/cni"),
    Path("/opt/containerd"),
    Path("/run/containerd"),
)
READY = "private mounts ready"
START_TIMEOUT = 30.0


def present(paths: Iterable[Path] = MACHINE_PATHS) -> set[Path]:
    """Which of `paths` exist on this machine now."""
    return {path for path in paths if path.exists()}


def overlaid(paths: Iterable[Path]) -> list[Path]:
    """The directories to overlay so that each of `paths` is written inside one: the
    nearest existing ancestor of each (a path that exists already is the machine's, and
    its parent is overlaid all the same), none below another."""
    tops = set()
    for path in paths:
        parent = path.parent
        while not parent.is_dir():
            parent = parent.parent
        tops.add(parent)
    return sorted(top for top in tops if not any(o != top and top.is_relative_to(o) for o in tops))


class PrivateMounts:
    """Start with `start()`; `enter(argv)` runs argv inside; `stop()` ends the holder (the
    namespace itself ends with the last process in it)."""

    def __init__(self, workdir: Path, *, name: str, paths: Sequence[Path] = MACHINE_PATHS):
        self.workdir = workdir / "private-mounts"
        self.name = name
        self.tops = overlaid(paths)
        self._holder: ManagedProcess | None = None

    @property
    def namespace(self) -> Path:
        assert self._holder is not None, "not started"
        return Path(f"/proc/{self._holder.pid}/ns/mnt")

    def start(self) -> PrivateMounts:
        lines = ["set -e"]
        for top in self.tops:
            if top == Path("/") or self.workdir.is_relative_to(top):
                raise ValueError(f"cannot overlay {top}: the world's directory is inside it")
            layer = self.workdir / str(top).strip("/").replace("/", "-")
            upper, work = layer / "upper", layer / "work"
            upper.mkdir(parents=True)
            work.mkdir()
            options = f"lowerdir={top},upperdir={upper},workdir={work}"
            lines.append(
                f"mount -t overlay overlay -o {shlex.quote(options)} {shlex.quote(str(top))}"
            )
        lines += [f"echo {shlex.quote(READY)}", "exec sleep infinity"]
        self._holder = ManagedProcess(
            ["unshare", "--mount", "--propagation", "slave", "--", "sh", "-c", "\n".join(lines)],
            name=f"{self.name}-mounts",
        )
        self._holder.wait_for_line(f"^{READY}$", timeout=START_TIMEOUT)
        return self

    def enter(self, argv: Sequence[str], *, net: Path | None = None) -> list[str]:
        """`argv` run in this mount namespace (and the network namespace `net`, if given)."""
        spaces = [f"--mount={self.namespace}"] + ([f"--net={net}"] if net else [])
        return ["nsenter", *spaces, "--", *argv]

    def mounts(self) -> list[str]:
        """The mount points inside (for a test to see that the daemons' mounts are there)."""
        table = (self.namespace.parent.parent / "mountinfo").read_text()
        return [line.split()[4].replace("\\040", " ") for line in table.splitlines()]

    def stop(self) -> None:
        if self._holder is not None:
            self._holder.stop(timeout=5)
            self._holder = None
