"""Other local users: they may not read the tunnel's status or recordings, nor make `down`
signal anything but their own kafkatunnel.

"Another user" is a real one: a forked child of the test that has dropped to `nobody`
(setgid, setuid) before it tries, so the kernel, not the code under test, says what it
may do. What the child runs is imported before the fork: the interpreter lives where
nobody may not read."""

from __future__ import annotations

import os
import pickle
import pwd
import shutil
import stat
import subprocess
import sys
import tempfile
import traceback
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from kafkatunnel.demo import LocalCluster, free_port_run
from kafkatunnel.demo.workload import produce
from kafkatunnel.pids import ours
from kafkatunnel.tunnel import ExecForwarder, TunnelConfig
from kafkatunnel.tunnel.background import BackgroundTunnel
from kafkatunnel.tunnel.control import fetch
from kafkatunnel.waiting import wait_for

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="needs root to become another user")


def as_nobody(action: Callable[[], Any]) -> Any:
    """What `action` returns (or the exception it raises, as a value) when run by `nobody`."""
    nobody = pwd.getpwnam("nobody")
    read_end, write_end = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: never returns into pytest
        os.close(read_end)
        try:
            os.setgroups([])
            os.setgid(nobody.pw_gid)
            os.setuid(nobody.pw_uid)
            try:
                result: Any = action()
            except BaseException as error:
                result = error
            data = pickle.dumps(result)
        except BaseException:
            data = pickle.dumps(RuntimeError(traceback.format_exc()))
        os.write(write_end, data)
        os._exit(0)
    os.close(write_end)
    with os.fdopen(read_end, "rb") as pipe:
        data = pipe.read()
    os.waitpid(pid, 0)
    return pickle.loads(data)


@pytest.fixture
def open_tmp() -> Iterator[Path]:
    """A temporary directory on a path `nobody` may walk (pytest's own sit in a 0700 one,
    which would refuse nobody whatever the modes below it)."""
    path = Path(tempfile.mkdtemp(prefix="kt-users-"))
    os.chmod(path, 0o755)
    yield path
    shutil.rmtree(path, ignore_errors=True)


@pytest.fixture
def running(
    cluster: LocalCluster, open_tmp: Path, monkeypatch: pytest.MonkeyPatch
) -> Iterator[BackgroundTunnel]:
    monkeypatch.setenv("KAFKATUNNEL_STATE_DIR", str(open_tmp / "state"))
    config = TunnelConfig(
        bootstrap=cluster.mock[0].address,
        listen_port=free_port_run(8),
        record_dir=open_tmp / "recordings",
    )
    tunnel = BackgroundTunnel(config, ExecForwarder(cluster.exec_template())).start()
    yield tunnel
    tunnel.stop()


def test_status_and_recordings_are_the_owners_alone(
    running: BackgroundTunnel, open_tmp: Path
) -> None:
    """Each file's own mode keeps nobody out: its directories are opened to nobody first,
    and each refusal is shown to turn into access once that mode is widened."""
    assert produce(running.bootstrap_servers, "owner-only", 5) == 5
    wait_for(  # a connection still ending would add to the recording between two reads
        lambda: not any(e["connections"] for e in running.status()["endpoints"]),
        timeout=30, what="the producer's connections to end in the tunnel",
    )  # fmt: skip
    assert running.tunnel.recorder is not None and running.tunnel.recorder.sync()
    control = running.status()["control"]
    assert control.startswith("unix:")
    assert "bootstrap_servers" in fetch(control, "/status")  # the owner may

    socket_path = Path(control[len("unix:") :])
    for path, mode in [
        (socket_path.parent, 0o700),
        (socket_path, 0o600),
        (open_tmp / "recordings", 0o700),
        *[(f, 0o600) for f in (open_tmp / "recordings").iterdir()],
    ]:
        assert stat.S_IMODE(path.lstat().st_mode) == mode, path

    # The way to the socket opened to nobody: the socket's own 0600 refuses them...
    assert socket_path.is_relative_to(open_tmp), socket_path
    for parent in socket_path.parents:
        if parent == open_tmp:
            break
        os.chmod(parent, 0o711)
    refused = as_nobody(lambda: fetch(control, "/status"))
    assert isinstance(refused, PermissionError), refused
    os.chmod(socket_path, 0o666)  # ...as widening it shows: then nobody reads the status
    assert "bootstrap_servers" in as_nobody(lambda: fetch(control, "/status"))
    os.chmod(socket_path, 0o600)

    recording = next((open_tmp / "recordings").iterdir())
    os.chmod(recording.parent, 0o711)
    unread = as_nobody(recording.read_bytes)
    assert isinstance(unread, PermissionError), unread
    os.chmod(recording, 0o644)
    assert as_nobody(recording.read_bytes) == recording.read_bytes()


def test_a_recording_never_follows_a_planted_symlink(tmp_path: Path) -> None:
    from kafkatunnel.files import create_private

    target = tmp_path / "victim"
    target.write_text("keep me")
    planted = tmp_path / "recording.pcapng"
    planted.symlink_to(target)
    with pytest.raises(FileExistsError):
        create_private(planted)
    assert target.read_text() == "keep me"


def test_down_stops_only_a_kafkatunnel_of_the_same_user(
    running: BackgroundTunnel, tmp_path: Path
) -> None:
    """`down` signals a pid from a state file only when it is a kafkatunnel of the same
    user: root's tunnel is not nobody's, and a process of root's own that is no
    kafkatunnel (a state file left stale, its pid reused) is left alone."""
    named = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)", "kafkatunnel"])
    try:  # ours once it has exec'd (before that, /proc shows the test's own command line)
        wait_for(lambda: ours(named.pid), timeout=10, what="a root process named kafkatunnel")
        assert as_nobody(lambda: ours(named.pid)) is False
    finally:
        named.kill()
        named.wait()

    sleeper = subprocess.Popen(["sleep", "60"])
    try:
        state = tmp_path / "root-state"
        state.mkdir(mode=0o700)
        (state / "tunnel-9093.json").write_text(f'{{"pid": {sleeper.pid}, "control": "unix:x"}}')
        result = subprocess.run(
            [sys.executable, "-m", "kafkatunnel", "down", "--all"],
            capture_output=True, text=True, timeout=30,
            env={**os.environ, "KAFKATUNNEL_STATE_DIR": str(state)},
        )  # fmt: skip
        assert "not a kafkatunnel process of yours" in result.stderr, result.stderr
        assert sleeper.poll() is None  # not signalled
    finally:
        sleeper.kill()
        sleeper.wait()
    assert "bootstrap_servers" in fetch(running.status()["control"], "/status")
