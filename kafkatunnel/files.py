"""Files the tunnel writes: its owner's alone, and whole or not at all.

Recordings hold a cluster's traffic and state files say where the tunnel's controls are, so
they are 0600 in 0700 directories, created without following a symlink another local user
could have planted. Files other programs read while we change them (state files, the
/etc/hosts block, the resolver journal) are written to a temporary file and renamed into
place, so a reader or a crash sees the old content or the new, never half of it.
"""

from __future__ import annotations

import contextlib
import errno
import os
import stat
import tempfile
from pathlib import Path

PRIVATE_DIR = 0o700
PRIVATE_FILE = 0o600


class UnsafePath(OSError):
    """A path the tunnel will not write through; the message says why and the fix."""


def state_dir() -> Path:
    """Where running tunnels keep their state (sockets, state files, logs, the resolver's
    journal): the user's runtime directory, else their home."""
    explicit = os.environ.get("KAFKATUNNEL_STATE_DIR")
    if explicit:
        return Path(explicit)
    runtime = os.environ.get("XDG_RUNTIME_DIR")
    return Path(runtime) / "kafkatunnel" if runtime else Path.home() / ".kafkatunnel" / "run"


def private_dir(directory: Path) -> Path:
    """`directory`, created 0700 if missing. An existing one must be a real directory (not
    a symlink) that the current user owns; its mode is then left as the user chose, except
    that a state directory (`tighten`) loses group and other access."""
    try:
        directory.mkdir(mode=PRIVATE_DIR, parents=True, exist_ok=True)
        info = os.lstat(directory)
    except OSError as error:
        raise UnsafePath(
            error.errno, f"cannot create {directory}: {error.strerror or error}"
        ) from None
    if stat.S_ISLNK(info.st_mode) or not stat.S_ISDIR(info.st_mode):
        raise UnsafePath(errno.ENOTDIR, f"{directory} is not a directory (a symlink?)")
    if info.st_uid != os.geteuid():
        raise UnsafePath(
            errno.EPERM,
            f"{directory} belongs to uid {info.st_uid}, not to you (uid {os.geteuid()}): "
            "choose a directory of your own",
        )
    return directory


def state_directory(directory: Path) -> Path:
    """A directory only its owner may enter (the tunnel's state: sockets, pids, logs)."""
    private_dir(directory)
    os.chmod(directory, PRIVATE_DIR)
    return directory


def create_private(path: Path) -> int:
    """A new file only its owner reads, opened for writing; never through a symlink, never
    over an existing file (FileExistsError: choose another name)."""
    flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC
    return os.open(path, flags, PRIVATE_FILE)


def write_whole(path: Path, data: bytes, mode: int = PRIVATE_FILE) -> None:
    """Replace `path` with `data` in one rename (a temporary file beside it first)."""
    temporary = _written_beside(path, data, mode)
    try:
        os.replace(temporary, path)
    finally:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(temporary)


def replace_system_file(path: Path, data: bytes) -> None:
    """Replace a file other programs read (/etc/hosts), keeping its owner and mode: by a
    rename when possible; in place where the file is a mount point of its own (containers
    bind-mount /etc/hosts, and rename() onto it fails with EBUSY)."""
    info = os.stat(path)
    temporary = _written_beside(path, data, stat.S_IMODE(info.st_mode))
    try:
        with contextlib.suppress(PermissionError):  # only root may give it away
            os.chown(temporary, info.st_uid, info.st_gid)
        os.replace(temporary, path)
        return
    except OSError as error:
        if error.errno not in (errno.EBUSY, errno.EXDEV):
            raise
    finally:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(temporary)
    with open(path, "r+b") as out:  # a bind mount: the one way is to write through it
        out.write(data)
        out.truncate()
        out.flush()
        os.fsync(out.fileno())


def _written_beside(path: Path, data: bytes, mode: int) -> str:
    """A temporary file next to `path` holding `data`, on disk, with `mode`."""
    fd, temporary = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.kafkatunnel.")
    try:
        with os.fdopen(fd, "wb") as out:
            out.write(data)
            out.flush()
            os.fsync(out.fileno())
        os.chmod(temporary, mode)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(temporary)
        raise
    return temporary


def inside(directory: Path, name: str) -> Path:
    """directory/name, refused unless it names an entry of `directory` itself (no
    separator, no `..`): for paths built from names the network handed us."""
    if not name or name in (".", "..") or "/" in name or "\0" in name:
        raise UnsafePath(errno.EINVAL, f"{name!r} cannot be a file name in {directory}")
    path = directory / name
    if path.parent != directory:
        raise UnsafePath(errno.EINVAL, f"{name!r} leaves {directory}")
    return path
