"""`sudo kafkatunnel up --dns`: root binds port 53 and sets up the resolver; the tunnel,
which reads what the cluster sends, runs as the user who typed sudo.

sudo is played by its environment (SUDO_UID, SUDO_GID, SUDO_USER of `nobody`) on a root
process, which is what sudo hands the command. The laptop is a network namespace whose
/etc/hosts is bind-mounted (`ip netns exec`), so the hosts method can run for real."""

from __future__ import annotations

import contextlib
import json
import os
import pwd
import shutil
import signal
import subprocess
import sys
import tempfile
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from kafkatunnel.demo import TANSU_HOST, LocalCluster
from kafkatunnel.demo.netns import NetworkNamespace
from kafkatunnel.demo.processes import ManagedProcess
from kafkatunnel.waiting import wait_for
from tests.proc import socket_inodes

ROOT = Path(__file__).resolve().parents[2]
TANSU_HOST_ADDRESS = "127.0.0.2"  # the shim's first address: the tansu broker's name
pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="plays sudo: needs root")


def _blocking_ancestor(path: Path) -> Path | None:
    """The first directory on `path` that other users may not traverse (/root, where a
    pyenv Python may live), or None."""
    for parent in reversed(path.parents):
        if parent != Path("/") and not os.stat(parent).st_mode & 0o001:
            return parent
    return None


@pytest.fixture
def readable_python() -> Iterator[list[str]]:
    """An argv prefix under which `nobody` can run this interpreter: in a mount namespace
    of its own, the directory that hides it is covered by a traversable one holding only
    the interpreter's tree (the machine itself is not changed)."""
    interpreter = Path(os.path.realpath(sys.executable))
    blocked = _blocking_ancestor(interpreter)
    if blocked is None:
        yield []
        return
    inner = blocked / interpreter.relative_to(blocked).parts[0]
    shadow = Path(tempfile.mkdtemp(prefix="kt-shadow-"))
    os.chmod(shadow, 0o711)
    (shadow / inner.name).mkdir(mode=0o755)
    script = (
        f'mount --bind "$1" "$2/{inner.name}" && mount --rbind "$2" "$3" && shift 3 && exec "$@"'
    )
    yield ["unshare", "-m", "sh", "-c", script, "sh", str(inner), str(shadow), str(blocked)]
    shutil.rmtree(shadow, ignore_errors=True)


def _uid(pid: int) -> int:
    line = next(
        x for x in Path(f"/proc/{pid}/status").read_text().splitlines() if x.startswith("Uid:")
    )
    return int(line.split()[2])  # effective


def _children(pid: int) -> list[int]:
    found = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            with contextlib.suppress(OSError):
                if int((entry / "stat").read_text().rsplit(")", 1)[1].split()[1]) == pid:
                    found.append(int(entry.name))
    return found


def _sockets(pid: int) -> dict[int, str]:
    """inode -> `tcp 127.0.0.2:9092 LISTEN` for the inet sockets of `pid`'s network."""
    found = {}
    for proto in ("tcp", "udp"):
        for row in Path(f"/proc/{pid}/net/{proto}").read_text().splitlines()[1:]:
            fields = row.split()
            address, port = fields[1].split(":")
            ip = ".".join(str(b) for b in reversed(bytes.fromhex(address)))
            state = "LISTEN" if fields[3] == "0A" else ("" if proto == "udp" else "other")
            found[int(fields[9])] = f"{proto} {ip}:{int(port, 16)} {state}".strip()
    return found


def test_under_sudo_the_tunnel_runs_as_the_user_and_root_only_sets_up(
    cluster: LocalCluster, readable_python: list[str]
) -> None:
    """A real client produces and consumes by the broker's in-cluster name through the
    tunnel that root handed to `nobody`: every listener and the DNS socket are the child's,
    root holds no inet socket at all, and root's hosts block is gone after the exit."""
    assert cluster.tansu is not None and cluster.namespace is not None
    nobody = pwd.getpwnam("nobody")
    state = Path(tempfile.mkdtemp(prefix="kt-sudo-state-"))
    os.chown(state, nobody.pw_uid, nobody.pw_gid)
    sudo = {"SUDO_UID": str(nobody.pw_uid), "SUDO_GID": str(nobody.pw_gid),
            "SUDO_USER": "nobody", "KAFKATUNNEL_STATE_DIR": str(state)}  # fmt: skip
    relay_port = 19092  # the laptop's way into the cluster (a port-forward, played by socat)
    into_cluster = " ".join(cluster.namespace.exec_prefix()) + " socat STDIO TCP\\:127.0.0.1\\:9092"
    try:
        with NetworkNamespace(hosts={"laptop.local": "127.0.1.1"}) as laptop:
            hosts_file = Path("/etc/netns") / laptop.name / "hosts"
            before = hosts_file.read_bytes()
            relay = ManagedProcess(
                [*laptop.exec_prefix(), "socat",
                 f"TCP-LISTEN:{relay_port},bind=127.0.0.1,fork,reuseaddr", f"EXEC:{into_cluster}"],
                name="relay",
            )  # fmt: skip
            up = [
                sys.executable, "-m", "kafkatunnel", "up", "--bootstrap", cluster.tansu.address,
                "--via", "direct", "--map", f"{cluster.tansu.address}=127.0.0.1:{relay_port}",
                "--dns", "--dns-listen", "127.0.0.1:53", "--dns-setup", "hosts", "--no-table",
            ]  # fmt: skip
            tunnel = ManagedProcess(
                [*readable_python, *laptop.exec_prefix(), *up], name="sudo-up", env=sudo
            )
            try:
                tunnel.wait_for_line(r"^resolver: hosts: ", timeout=30)
                assert TANSU_HOST in hosts_file.read_text()
                # root waits, the tunnel (its child) is nobody's
                root = next(
                    p for p in [tunnel.pid, *_children(tunnel.pid)] if _cmd(p).startswith("python")
                )
                [child] = wait_for(lambda: _children(root), timeout=10, what="the tunnel")
                assert _uid(root) == 0 and _uid(child) == nobody.pw_uid

                # a real client, by the in-cluster name, through the child
                topic = f"sudo-{uuid.uuid4().hex[:6]}"
                workload = [*laptop.exec_prefix(), sys.executable, "-m",
                            "kafkatunnel.demo.workload"]  # fmt: skip
                produced = subprocess.run([*workload, "produce", cluster.tansu.address, topic, "5"],
                                          capture_output=True, text=True, timeout=60)  # fmt: skip
                assert produced.stdout.strip() == "PRODUCED 5", produced.stderr[-2000:]
                consumed = subprocess.run(
                    [*workload, "consume", cluster.tansu.address, f"{topic}-g", topic, "5"],
                    capture_output=True, text=True, timeout=60,
                )  # fmt: skip
                assert consumed.stdout.startswith("CONSUMED 5"), consumed.stderr[-2000:]

                # who holds what: the listeners and port 53 are the child's, root has none
                sockets = _sockets(child)
                held = {i: sockets[i] for i in socket_inodes(child) if i in sockets}
                served = sorted(v for v in held.values() if v.endswith("LISTEN") or "udp" in v)
                assert "udp 127.0.0.1:53" in served, served
                assert "tcp 127.0.0.1:53 LISTEN" in served, served
                assert f"tcp {TANSU_HOST_ADDRESS}:9092 LISTEN" in served, served
                assert "tcp 127.0.0.1:9092 LISTEN" in served, served  # bootstrap.servers
                assert not socket_inodes(root) & set(sockets), {
                    i: sockets[i] for i in socket_inodes(root) if i in sockets
                }
                os.kill(child, signal.SIGTERM)  # as `kafkatunnel down` by the user does
                assert tunnel.popen.wait(timeout=20) == 0, tunnel.output()
            finally:
                tunnel.stop()
                relay.stop()
            assert "resolver: remove the managed block" in tunnel.output()
            assert hosts_file.read_bytes() == before
    finally:
        shutil.rmtree(state, ignore_errors=True)


@pytest.fixture
def open_tmp() -> Iterator[Path]:
    """A temporary directory every user may enter (pytest's own sit in a 0700 one)."""
    path = Path(tempfile.mkdtemp(prefix="kt-open-"))
    os.chmod(path, 0o755)
    yield path
    shutil.rmtree(path, ignore_errors=True)


def _sudo_up_in_a_laptop(
    readable_python: list[str], sudo: dict[str, str], cwd: Path
) -> subprocess.CompletedProcess[str]:
    """`up --dns` under played sudo, in a laptop namespace of its own: should it go on past
    the check it is meant to stop at, its resolver set-up lands in the laptop's bind-mounted
    /etc/hosts (checked unchanged), never in the machine's."""
    with NetworkNamespace(hosts={"laptop.local": "127.0.1.1"}) as laptop:
        hosts_file = Path("/etc/netns") / laptop.name / "hosts"
        before = hosts_file.read_bytes()
        result = subprocess.run(
            [*readable_python, *laptop.exec_prefix(), sys.executable, "-m", "kafkatunnel", "up",
             "--bootstrap", "kafka-0.kafka-headless.demo.svc.cluster.local:9092", "--via",
             "direct", "--map", "kafka-0.kafka-headless.demo.svc.cluster.local:9092=127.0.0.1:1",
             "--dns", "--dns-listen", "127.0.0.1:5353", "--dns-setup", "hosts", "--no-table"],
            capture_output=True, text=True, timeout=60, env={**os.environ, **sudo}, cwd=cwd,
        )  # fmt: skip
        assert hosts_file.read_bytes() == before, result.stdout + result.stderr
    return result


def test_an_installation_the_user_cannot_read_stops_with_the_path_and_the_fix(
    readable_python: list[str], open_tmp: Path
) -> None:
    """The package where `nobody` may not enter (a 0700 directory of root's): `up` stops
    before dropping root, naming the path, the user and the fix, with no traceback."""
    nobody = pwd.getpwnam("nobody")
    hidden = open_tmp / "hidden"
    shutil.copytree(ROOT / "kafkatunnel", hidden / "kafkatunnel")
    os.chmod(hidden, 0o700)
    sudo = {"SUDO_UID": str(nobody.pw_uid), "SUDO_GID": str(nobody.pw_gid),
            "SUDO_USER": "nobody", "PYTHONPATH": str(hidden)}  # fmt: skip
    result = _sudo_up_in_a_laptop(readable_python, sudo, open_tmp)
    output = result.stdout + result.stderr
    assert result.returncode == 2, output
    assert (
        "under sudo the tunnel runs as nobody, but nobody cannot read the kafkatunnel package"
        in output
    )
    assert f"{hidden} is drwx------, owned by root" in output, output
    assert "fix: install kafkatunnel with a Python nobody can read" in output, output
    assert "Traceback" not in output and "kafkatunnel bug" not in output, output


def test_a_package_file_the_user_cannot_read_stops_with_its_path(
    readable_python: list[str], open_tmp: Path
) -> None:
    """Every directory open, one module of the package root's alone (0600): Python would
    import it lazily, as the user, long after the drop. `up` names that file and stops."""
    nobody = pwd.getpwnam("nobody")
    copy = open_tmp / "visible"
    shutil.copytree(ROOT / "kafkatunnel", copy / "kafkatunnel",
                    ignore=shutil.ignore_patterns("__pycache__"))  # fmt: skip
    closed = copy / "kafkatunnel" / "verify" / "junit.py"
    os.chmod(closed, 0o600)
    sudo = {"SUDO_UID": str(nobody.pw_uid), "SUDO_GID": str(nobody.pw_gid),
            "SUDO_USER": "nobody", "PYTHONPATH": str(copy)}  # fmt: skip
    result = _sudo_up_in_a_laptop(readable_python, sudo, open_tmp)
    output = " ".join((result.stdout + result.stderr).split())
    assert result.returncode == 2, output
    assert f"nobody cannot read the kafkatunnel package at {closed}" in output, output
    assert f"{closed} is -rw-------, owned by root" in output, output
    assert "Traceback" not in output, output


def _cmd(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/comm").read_text().strip()
    except OSError:
        return ""


# The child's side of the channel, played by a script: as `nobody`, it sends the root
# helper each line of its standard input and prints each answer.
HOSTILE_CHILD = """
import sys
from kafkatunnel.hostnames import ClusterZones
from kafkatunnel.privileges import User, split_privileges
uid, gid, host = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3]
channel = split_privileges(User(uid, gid, "nobody", "/"), ClusterZones.of([host]))
for line in sys.stdin:
    channel.file.write(line)
    channel.file.flush()
    print(channel.file.readline().strip() or '{"closed": true}', flush=True)
"""


def _setup(**changes: object) -> str:
    asked: dict[str, object] = {"method": "hosts", "names": {TANSU_HOST: "127.0.0.2"},
             "domains": ["cluster.local"], "server": ["127.0.0.1", 53]}  # fmt: skip
    asked.update(changes)
    return json.dumps({"setup": asked})


HOSTILE_REQUESTS = [
    # a second line in /etc/resolver/<domain>, or a resolver on the internet
    _setup(method="resolver-dir", server=["127.0.0.1\nnameserver 6.6.6.6", 53]),
    _setup(method="resolver-dir", server=["8.8.8.8", 53]),
    _setup(method="systemd-resolved", server=["127.0.0.1", "53; reboot"]),
    _setup(server=["127.0.0.1", True]),
    _setup(method="../../../tmp/x"),
    _setup(method=["hosts"]),
    _setup(names={TANSU_HOST: "6.6.6.6"}),  # the cluster's name to an address elsewhere
    _setup(names={TANSU_HOST: "127.0.0.2", "github.com": "127.0.0.2"}),
    _setup(names={"kafka-3.github.com.svc": "127.0.0.2", "kafka-3.github.com": "127.0.0.2"}),
    _setup(domains=["com"]),
    _setup(names=[TANSU_HOST]),
    _setup(hosts_file="/etc/shadow"),
    json.dumps({"setup": json.loads(_setup())["setup"], "teardown": True}),
    "not json",
]


def test_the_root_helper_refuses_what_the_tunnel_never_sends(
    readable_python: list[str], tmp_path: Path
) -> None:
    """The root helper takes nothing on the child's word: a hostile child's requests are
    each refused and said on root's stderr, nothing is written, and a good request is
    still served; a request past the size limit ends the channel."""
    nobody = pwd.getpwnam("nobody")
    resolver_file = Path("/etc/resolver/cluster.local")
    assert not resolver_file.exists()
    os.chmod(tmp_path, 0o700)  # root's journal
    lines = [*HOSTILE_REQUESTS, _setup(), json.dumps({"teardown": True}), "x" * (1 << 20)]
    with NetworkNamespace(hosts={"laptop.local": "127.0.1.1"}) as laptop:
        hosts_file = Path("/etc/netns") / laptop.name / "hosts"
        before = hosts_file.read_bytes()
        result = subprocess.run(
            [*readable_python, *laptop.exec_prefix(), sys.executable, "-c", HOSTILE_CHILD,
             str(nobody.pw_uid), str(nobody.pw_gid), TANSU_HOST],
            input="\n".join(lines) + "\n", capture_output=True, text=True, timeout=60,
            env={**os.environ, "KAFKATUNNEL_STATE_DIR": str(tmp_path)},
            cwd=Path(__file__).resolve().parents[2],
        )  # fmt: skip
        assert hosts_file.read_bytes() == before
    answers: list[dict[str, Any]] = [json.loads(a) for a in result.stdout.splitlines()]
    assert len(answers) == len(lines), (result.stdout, result.stderr[-3000:])
    for request, answer in zip(HOSTILE_REQUESTS, answers, strict=False):
        assert "the privileged helper refused" in answer["error"], (request, answer)
    served, torn_down, too_long = answers[len(HOSTILE_REQUESTS) :]
    assert served["method"] == "hosts" and "managed block of 1 names" in served["steps"][0]
    assert torn_down["steps"] == [f"remove the managed block from {Path('/etc/hosts')}"]
    assert "characters or more" in too_long["error"]
    refused = [x for x in result.stderr.splitlines() if x.startswith("resolver helper: refused")]
    assert len(refused) == len(HOSTILE_REQUESTS) + 1, result.stderr
    assert not resolver_file.exists()
