"""Files the tunnel writes: whole or not at all, the owner's, and never through a path a
name could steer."""

from __future__ import annotations

import errno
import os
import stat
import subprocess
import sys
from pathlib import Path

import pytest

from kafkatunnel.files import (
    UnsafePath,
    create_private,
    inside,
    private_dir,
    replace_system_file,
    write_whole,
)

pytestmark = pytest.mark.quick


def test_files_are_written_whole_or_not_at_all(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A state file is replaced in one rename: a write that fails halfway (here: the disk
    full at fsync) leaves the old content and no temporary file behind."""
    state = tmp_path / "tunnel-9092.json"
    write_whole(state, b'{"pid": 1}')
    assert state.read_bytes() == b'{"pid": 1}'
    assert stat.S_IMODE(state.stat().st_mode) == 0o600

    def full(fd: int) -> None:
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(os, "fsync", full)
    with pytest.raises(OSError, match="No space"):
        write_whole(state, b'{"pid": 2, "half": "writ')
    assert state.read_bytes() == b'{"pid": 1}'
    assert sorted(p.name for p in tmp_path.iterdir()) == ["tunnel-9092.json"]


@pytest.mark.skipif(os.geteuid() != 0, reason="needs root for a mount namespace")
def test_a_bind_mounted_hosts_file_is_written_in_place(tmp_path: Path) -> None:
    """rename() onto a mount point fails with EBUSY (containers bind-mount /etc/hosts):
    the file is then written through, keeping its mode."""
    source, target = tmp_path / "source", tmp_path / "etc" / "hosts"
    target.parent.mkdir()
    source.write_text("127.0.0.1 localhost\n")
    target.write_text("")
    os.chmod(source, 0o644)
    script = (
        "import sys; from pathlib import Path; from kafkatunnel.files import replace_system_file;"
        "replace_system_file(Path(sys.argv[1]), b'127.0.0.1 localhost\\n10.0.0.1 kafka\\n')"
    )
    done = subprocess.run(
        ["unshare", "-m", "sh", "-c", 'mount --bind "$1" "$2" && exec "$3" -c "$4" "$2"',
         "sh", str(source), str(target), sys.executable, script],
        capture_output=True, text=True, timeout=30,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert source.read_text() == "127.0.0.1 localhost\n10.0.0.1 kafka\n"  # through the mount
    assert stat.S_IMODE(source.stat().st_mode) == 0o644
    assert sorted(p.name for p in target.parent.iterdir()) == ["hosts"]


def test_replacing_keeps_the_owner_and_mode(tmp_path: Path) -> None:
    hosts = tmp_path / "hosts"
    hosts.write_text("old\n")
    os.chmod(hosts, 0o644)
    replace_system_file(hosts, b"new\n")
    assert hosts.read_text() == "new\n" and stat.S_IMODE(hosts.stat().st_mode) == 0o644


def test_paths_built_from_names_stay_inside(tmp_path: Path) -> None:
    assert inside(tmp_path, "cluster.local") == tmp_path / "cluster.local"
    for name in ("..", "../etc", "a/b", "", ".", "x\0y"):
        with pytest.raises(UnsafePath):
            inside(tmp_path, name)


def test_private_files_and_directories(tmp_path: Path) -> None:
    directory = private_dir(tmp_path / "recordings")
    assert stat.S_IMODE(directory.stat().st_mode) == 0o700
    os.close(create_private(directory / "a.pcapng"))
    assert stat.S_IMODE((directory / "a.pcapng").stat().st_mode) == 0o600
    with pytest.raises(FileExistsError):  # never over what exists, symlink or not
        create_private(directory / "a.pcapng")
    (tmp_path / "link").symlink_to(directory)
    with pytest.raises(UnsafePath, match="not a directory"):
        private_dir(tmp_path / "link")
