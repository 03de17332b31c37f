"""`kafkatunnel run -- CMD` and `kafkatunnel env`, as a shell, an IDE or CI use them, on the
mock cluster: the command gets the settings, its exit status is run's, Ctrl-C reaches it,
a running tunnel is joined and left running, a tunnel that cannot start never runs the
command, nothing is left behind; kcat reads the settings itself (KCAT_CONFIG), with groups
on every coordinator; `eval "$(kafkatunnel env)"` in bash, then kcat, consumes."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import uuid
from pathlib import Path

import pytest

from kafkatunnel.demo import LocalCluster, free_port_run
from kafkatunnel.demo.processes import ManagedProcess
from kafkatunnel.demo.workload import produce
from kafkatunnel.tunnel.control import running_tunnels
from kafkatunnel.waiting import wait_for

MESSAGES = 12


def _up_args(cluster: LocalCluster, port: int) -> list[str]:
    return ["--bootstrap", cluster.mock[0].address, "--via", "exec",
            "--exec", cluster.exec_template(), "--listen", f"127.0.0.1:{port}"]  # fmt: skip


def _run(
    cluster: LocalCluster, state: Path, *command: str, port: int | None = None,
    extra: tuple[str, ...] = (), timeout: float = 120,
) -> subprocess.CompletedProcess[str]:  # fmt: skip
    port = port or free_port_run(8)
    argv = [sys.executable, "-m", "kafkatunnel", "run", *_up_args(cluster, port), *extra,
            "--", *command]  # fmt: skip
    return subprocess.run(argv, capture_output=True, text=True, timeout=timeout,
                          env={**os.environ, "KAFKATUNNEL_STATE_DIR": str(state)})  # fmt: skip


def _nothing_left(state: Path, port: int) -> None:
    """No tunnel, no state file, log or settings file: the state directory as it was."""
    left = sorted(p.name for p in state.iterdir()) if state.exists() else []
    assert left == [], left
    listing = subprocess.run(["ps", "-eo", "args"], capture_output=True, text=True, timeout=30)
    assert [line for line in listing.stdout.splitlines() if f"127.0.0.1:{port}" in line] == []


@pytest.mark.parametrize(("script", "status"), [("exit 0", 0), ("exit 1", 1), ("exit 3", 3),
                                                ("kill -KILL $$", 128 + 9)])  # fmt: skip
def test_the_command_gets_the_settings_and_run_exits_with_its_status(
    cluster: LocalCluster, tmp_path: Path, script: str, status: int
) -> None:
    state, seen = tmp_path / "state", tmp_path / "seen"
    port = free_port_run(8)
    shown = (
        'printf "%s\\n" "$KAFKA_BOOTSTRAP_SERVERS" "$SPRING_KAFKA_BOOTSTRAP_SERVERS" '
        f'"$(cat "$KAFKA_CLIENT_PROPERTIES")" "$(cat "$KCAT_CONFIG")" > {seen}; {script}'
    )
    done = _run(cluster, state, "sh", "-c", shown, port=port)
    assert done.returncode == status, done.stderr
    assert "Traceback" not in done.stderr
    told = seen.read_text().splitlines()
    assert told == [f"127.0.0.1:{port}"] * 2 + [f"bootstrap.servers=127.0.0.1:{port}"] * 2
    _nothing_left(state, port)


def test_ctrl_c_reaches_the_command_and_then_the_tunnel_stops(
    cluster: LocalCluster, tmp_path: Path
) -> None:
    """As a terminal sends it: SIGINT to the foreground process group, run and the command
    in it; the command dies of it, run passes that on as 130."""
    state, ready = tmp_path / "state", tmp_path / "ready"
    started = ("import pathlib, signal, time; signal.signal(signal.SIGINT, signal.SIG_DFL); "
               f"pathlib.Path({str(ready)!r}).touch(); time.sleep(120)")  # fmt: skip
    command = [sys.executable, "-c", started]
    port = free_port_run(8)
    argv = [sys.executable, "-m", "kafkatunnel", "run", *_up_args(cluster, port),
            "--", *command]  # fmt: skip
    run = subprocess.Popen(argv, start_new_session=True, stdout=subprocess.PIPE,
                           stderr=subprocess.PIPE, text=True,
                           env={**os.environ, "KAFKATUNNEL_STATE_DIR": str(state)})  # fmt: skip
    try:
        wait_for(ready.exists, timeout=60, what="the command to start under run")
        os.killpg(run.pid, signal.SIGINT)
        _, err = run.communicate(timeout=60)
    finally:
        if run.poll() is None:
            os.killpg(run.pid, signal.SIGKILL)
    assert run.returncode == 130, err
    assert "Traceback" not in err
    _nothing_left(state, port)


def test_a_running_tunnel_to_the_same_cluster_is_joined_and_left_running(
    cluster: LocalCluster, tmp_path: Path
) -> None:
    state, seen = tmp_path / "state", tmp_path / "seen"
    port = free_port_run(8)
    up = ManagedProcess([sys.executable, "-m", "kafkatunnel", "up", *_up_args(cluster, port),
                         "--no-table"], name="kafkatunnel-up",
                        env={"KAFKATUNNEL_STATE_DIR": str(state)})  # fmt: skip
    try:
        up.wait_for_line(r"^bootstrap\.servers=", timeout=30)
        # another --listen: the same cluster all the same, so the running tunnel serves
        done = _run(cluster, state, "sh", "-c", f'echo "$KAFKA_BOOTSTRAP_SERVERS" > {seen}',
                    port=free_port_run(8))  # fmt: skip
        assert done.returncode == 0, done.stderr
        assert seen.read_text().strip() == f"127.0.0.1:{port}"
        assert f"joined the running tunnel (pid {up.pid})" in done.stderr
        assert up.alive()
        assert list(_tunnels(state)) == [port]
    finally:
        up.stop()


def _tunnels(state: Path) -> dict[int, object]:
    previous = os.environ.get("KAFKATUNNEL_STATE_DIR")
    os.environ["KAFKATUNNEL_STATE_DIR"] = str(state)
    try:
        return dict(running_tunnels())
    finally:
        if previous is None:
            del os.environ["KAFKATUNNEL_STATE_DIR"]
        else:
            os.environ["KAFKATUNNEL_STATE_DIR"] = previous


def test_a_tunnel_that_cannot_start_never_runs_the_command(
    cluster: LocalCluster, tmp_path: Path
) -> None:
    state, ran, port = tmp_path / "state", tmp_path / "ran", free_port_run(8)
    argv = [sys.executable, "-m", "kafkatunnel", "run", "--bootstrap", "kafka-0.kafka:9092",
            "--via", "exec", "--exec", "false {host} {port}", "--start-timeout", "3",
            "--listen", f"127.0.0.1:{port}", "--", "touch", str(ran)]  # fmt: skip
    done = subprocess.run(argv, capture_output=True, text=True, timeout=120,
                          env={**os.environ, "KAFKATUNNEL_STATE_DIR": str(state)})  # fmt: skip
    assert done.returncode == 2, done.stderr
    assert "the tunnel exited" in done.stderr and "Traceback" not in done.stderr
    assert not ran.exists()
    _nothing_left(state, port)


def test_a_wrong_flag_is_said_before_anything_starts(tmp_path: Path) -> None:
    ran = tmp_path / "ran"
    done = subprocess.run([sys.executable, "-m", "kafkatunnel", "run", "--namspace", "shop",
                           "--", "touch", str(ran)], capture_output=True, text=True,
                          timeout=60)  # fmt: skip
    assert done.returncode == 2
    assert "--namspace" in done.stderr and "Traceback" not in done.stderr
    assert not ran.exists()


def test_kcat_consumes_with_groups_on_every_coordinator_reading_kcat_config(
    cluster: LocalCluster, tmp_path: Path
) -> None:
    topic = f"run-{uuid.uuid4().hex[:8]}"
    spread = cluster.groups_by_coordinator(1, prefix=f"{topic}-g")
    assert len(spread) == 3
    assert cluster.produce_inside(topic, MESSAGES) == MESSAGES
    consume = " && ".join(
        f"kcat -C -G {group} -o beginning -c {MESSAGES} -q -f '%s\\n' {topic} > {tmp_path / group}"
        for groups in spread.values() for group in groups
    )  # fmt: skip
    done = _run(cluster, tmp_path / "state", "timeout", "90", "sh", "-c", consume)
    assert done.returncode == 0, done.stderr
    for groups in spread.values():
        for group in groups:
            assert len((tmp_path / group).read_text().splitlines()) == MESSAGES, group


def test_eval_env_in_bash_then_kcat_consumes(cluster: LocalCluster, tmp_path: Path) -> None:
    state = tmp_path / "state"
    port = free_port_run(8)
    topic = f"env-{uuid.uuid4().hex[:8]}"
    up = ManagedProcess([sys.executable, "-m", "kafkatunnel", "up", *_up_args(cluster, port),
                         "--no-table"], name="kafkatunnel-up",
                        env={"KAFKATUNNEL_STATE_DIR": str(state)})  # fmt: skip
    try:
        bootstrap = up.wait_for_line(r"^bootstrap\.servers=(\S+)$", timeout=30).group(1)
        assert produce(bootstrap, topic, MESSAGES) == MESSAGES
        script = (f'eval "$({sys.executable} -m kafkatunnel env)" && '
                  f"kcat -C -o beginning -e -q -f '%s\\n' -t {topic}")  # fmt: skip
        done = subprocess.run(["bash", "-c", script], capture_output=True, text=True, timeout=60,
                              env={**os.environ, "KAFKATUNNEL_STATE_DIR": str(state),
                                   "HOME": str(tmp_path)})  # fmt: skip
        assert done.returncode == 0, done.stderr
        assert len(done.stdout.splitlines()) == MESSAGES
    finally:
        up.stop()


def test_a_tunnel_that_dies_while_the_command_runs_is_said_and_the_command_runs_on(
    cluster: LocalCluster, tmp_path: Path
) -> None:
    state, after = tmp_path / "state", tmp_path / "after"
    killing = (f"{sys.executable} -m kafkatunnel status --json | {sys.executable} -c "
               "'import json, os, sys; os.kill(json.load(sys.stdin)[\"pid\"], 9)'; "
               f"sleep 3; touch {after}")  # fmt: skip
    done = _run(cluster, state, "sh", "-c", killing)
    assert done.returncode == 0, done.stderr
    assert after.exists()
    assert "the tunnel exited (-9) while the command runs" in done.stderr, done.stderr
    assert "Traceback" not in done.stderr
