"""`kafkatunnel up` as users and scripts run it: the printed bootstrap.servers, `status
--json` from another process, and a clean stop on SIGTERM."""

from __future__ import annotations

import json
import os
import re
import signal
import socket
import subprocess
import sys
import uuid
from collections.abc import Callable
from pathlib import Path

import pytest

from kafkatunnel.cli.main import command as kafkatunnel_command
from kafkatunnel.cli.settings import all_settings
from kafkatunnel.demo import LocalCluster, free_port_run
from kafkatunnel.demo.harness import start_tansu
from kafkatunnel.demo.processes import ManagedProcess
from kafkatunnel.demo.workload import consume_group, produce
from kafkatunnel.tunnel.control import fetch


def _cli(*args: str, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    inherited = {k: v for k, v in os.environ.items() if k != "COLUMNS"}
    return subprocess.run(
        [sys.executable, "-m", "kafkatunnel", *args],
        capture_output=True, text=True, env={**inherited, **env}, timeout=60,
    )  # fmt: skip


ROOT = Path(__file__).resolve().parents[2]
# Where the project tells its users of variables: its messages, scripts, worlds and docs.
TELLING = [ROOT / "kafkatunnel", ROOT / "scripts", ROOT / "tests" / "worlds", ROOT / "docs",
           ROOT / "README.md"]  # fmt: skip
VARIABLE = re.compile(r"\bKAFKATUNNEL_[A-Z0-9_]*[A-Z0-9]\b")
MISSPELT = {"KAFKATUNNEL_NAMESPAC"}  # docs/configuration.md's example of a mistake


def _variables_named() -> set[str]:
    named: set[str] = set()
    for place in TELLING:
        for path in [place] if place.is_file() else place.rglob("*"):
            if path.is_file() and path.suffix in ("", ".py", ".sh", ".md", ".toml"):
                named |= set(VARIABLE.findall(path.read_text(errors="replace")))
    return named - MISSPELT


def test_up_starts_with_every_variable_the_project_names_set(
    cluster: LocalCluster, tmp_path: Path
) -> None:
    """Each KAFKATUNNEL_* variable a message, script or page names, set as it says, and
    `up` starts all the same: none is refused as "not a kafkatunnel setting" (as the
    Apache Kafka demo's KAFKATUNNEL_KAFKA_LIB was). A setting's own variable is a setting
    by construction; the others are set here, each to what it names."""
    settings = {s.variable for s in all_settings(kafkatunnel_command()).values()}
    others = _variables_named() - settings
    assert {"KAFKATUNNEL_KAFKA_LIB", "KAFKATUNNEL_STATE_DIR"} <= others
    (tmp_path / "kafkatunnel.toml").write_text("[profiles.dev]\n")
    (tmp_path / "client.properties").write_text("client.id=x\n")
    values = {
        "KAFKATUNNEL_CONFIG": str(tmp_path / "kafkatunnel.toml"),
        "KAFKATUNNEL_PROFILE": "dev",
        "KAFKATUNNEL_STATE_DIR": str(tmp_path),
        "KAFKATUNNEL_CLIENT_CONFIG": str(tmp_path / "client.properties"),
        "KAFKATUNNEL_KAFKA_LIB": str(tmp_path),
        "KAFKATUNNEL_TLS_PASSWORD": "secret",
    }
    env = {name: values.get(name, "x") for name in others}
    port = free_port_run(8)
    up = ManagedProcess(
        [sys.executable, "-m", "kafkatunnel", "up", "--bootstrap", cluster.mock[0].address,
         "--via", "exec", "--exec", cluster.exec_template(),
         "--listen", f"127.0.0.1:{port}", "--no-table"],
        name="kafkatunnel-up", env=env,
    )  # fmt: skip
    try:
        up.wait_for_line(r"^bootstrap\.servers=127\.0\.0\.1:", timeout=30)
    finally:
        up.stop()
    assert "not a kafkatunnel setting" not in up.output()


@pytest.mark.parametrize("loop", ["uvloop", "asyncio"])
def test_up_status_and_sigterm(cluster: LocalCluster, tmp_path: Path, loop: str) -> None:
    env = {"KAFKATUNNEL_STATE_DIR": str(tmp_path)}
    port = free_port_run(8)
    up = ManagedProcess(
        [
            sys.executable, "-m", "kafkatunnel", "up",
            "--bootstrap", cluster.mock[0].address,
            "--via", "exec", "--exec", cluster.exec_template(),
            "--listen", f"127.0.0.1:{port}", "--no-table", "--loop", loop,
        ],
        name="kafkatunnel-up", env=env,
    )  # fmt: skip
    try:
        line = up.wait_for_line(r"^bootstrap\.servers=(\S+)$", timeout=30)
        bootstrap = line.group(1)
        assert bootstrap == f"127.0.0.1:{port}"
        up.wait_for_line(r"^broker 3: ", timeout=10)

        topic = f"cli-{uuid.uuid4().hex[:6]}"
        assert produce(bootstrap, topic, 10) == 10
        assert consume_group(bootstrap, f"{topic}-g", topic, 10, timeout=60).consumed == 10

        status = _cli("status", "--json", env=env)
        assert status.returncode == 0, status.stderr
        state = json.loads(status.stdout)
        assert state["bootstrap_servers"] == bootstrap
        metrics = fetch(state["control"], "/metrics")  # as docs/configuration.md says
        assert "kafkatunnel_connections_total" in metrics
        assert [e["node_id"] for e in state["endpoints"]] == [None, 1, 2, 3]
        assert sum(e["total_connections"] for e in state["endpoints"]) > 0

        table = _cli("status", env=env)  # piped, COLUMNS unset: no cell is cut
        assert table.returncode == 0, table.stderr
        flat = " ".join(table.stdout.split())
        assert "…" not in table.stdout
        for endpoint in state["endpoints"]:
            assert endpoint["route"] in flat and endpoint["advertised"] in flat, table.stdout

        os.kill(up.pid, signal.SIGTERM)
        assert up.popen.wait(timeout=15) == 0
        up.wait_for_line(r"tunnel closed", timeout=5)
        assert not list(tmp_path.glob("tunnel-*.json"))  # the state file is gone
        gone = _cli("status", "--json", env=env)
        assert gone.returncode == 1 and "no running tunnel" in gone.stdout + gone.stderr
    finally:
        up.stop()


@pytest.mark.parametrize(
    ("flags", "fix"),
    [
        (lambda taken: ["--listen", f"127.0.0.1:{taken}"], "--listen"),
        # a pinned broker port is bound at start: taken, it is an error then, not later
        (lambda taken: ["--listen", f"127.0.0.1:{free_port_run(8)}", "--broker-port",
                        f"2={taken}"], "--broker-port 2=PORT"),
    ],
    ids=["listen", "pinned-broker-port"],
)  # fmt: skip
def test_port_in_use_via_the_cli(
    cluster: LocalCluster, tmp_path: Path, flags: Callable[[int], list[str]], fix: str
) -> None:
    """A port someone else holds stops the start, naming the holder and the flag."""
    holder = socket.socket()
    holder.bind(("127.0.0.1", 0))
    holder.listen()
    port = holder.getsockname()[1]
    try:
        result = _cli(
            "up", "--bootstrap", cluster.mock[0].address, "--exec", cluster.exec_template(),
            *flags(port), "--no-table", env={"KAFKATUNNEL_STATE_DIR": str(tmp_path)},
        )  # fmt: skip
    finally:
        holder.close()
    assert result.returncode == 2
    assert f"port {port} on 127.0.0.1 is already in use by python (pid {os.getpid()})" in (
        result.stderr
    )
    assert fix in result.stderr


def test_wrong_flags_name_the_fix(tmp_path: Path) -> None:
    env = {"KAFKATUNNEL_STATE_DIR": str(tmp_path)}
    cases = [
        (["up", "--bootstrap", "kafka:9092", "--via", "exec"], "--exec"),
        (["up", "--bootstrap", "kafka:9092", "--exec", "nc {hots} {port}"], "{hots}"),
        (["up", "--bootstrap", "kafka:9092", "--exec", "nc kafka 9092"], "has no {port}"),
        (["up", "--bootstrap", "kafka:9092", "--via", "direct", "--map", "a=b"], "HOST:PORT"),
        (["up", "--bootstrap", "kafka", "--via", "direct"], "advertised HOST:PORT"),
        (["up", "--bootstrap", "k:1", "--via", "ssh", "--exec", "x {port}"], "exec, direct"),
    ]
    for args, expected in cases:
        result = _cli(*args, env=env)
        assert result.returncode == 2, (args, result.stdout, result.stderr)
        assert expected in result.stdout + result.stderr, (args, result.stderr)


def test_up_detach_status_and_down(cluster: LocalCluster, tmp_path: Path) -> None:
    env = {"KAFKATUNNEL_STATE_DIR": str(tmp_path)}
    port = free_port_run(8)
    started = _cli(
        "up", "--detach", "--bootstrap", cluster.mock[0].address, "--via", "exec",
        "--exec", cluster.exec_template(), "--listen", f"127.0.0.1:{port}", env=env,
    )  # fmt: skip
    try:
        assert started.returncode == 0, started.stdout + started.stderr
        assert f"bootstrap.servers=127.0.0.1:{port}" in started.stdout
        assert "kafkatunnel down" in started.stdout
        (state_file,) = tmp_path.glob("tunnel-*.json")
        pid = json.loads(state_file.read_text())["pid"]
        topic = f"detached-{uuid.uuid4().hex[:6]}"
        assert produce(f"127.0.0.1:{port}", topic, 5) == 5
        assert _cli("status", "--json", env=env).returncode == 0
        stopped = _cli("down", env=env)
        assert stopped.returncode == 0 and f"tunnel on port {port} (pid {pid}) stopped" in (
            stopped.stdout
        )
        assert not list(tmp_path.glob("tunnel-*.json"))
        with pytest.raises(ProcessLookupError):
            os.kill(pid, 0)
        again = _cli("down", env=env)
        assert again.returncode == 1 and "no running tunnel" in again.stderr
    finally:
        for leftover in tmp_path.glob("tunnel-*.json"):
            os.kill(json.loads(leftover.read_text())["pid"], signal.SIGKILL)


def test_a_detached_tunnel_that_cannot_start_says_why(tmp_path: Path) -> None:
    env = {"KAFKATUNNEL_STATE_DIR": str(tmp_path)}
    taken = free_port_run(1)
    with socket.socket() as holder:
        holder.bind(("127.0.0.1", taken))
        holder.listen()
        failed = _cli(
            "up", "--detach", "--bootstrap", "kafka-0.kafka:9092", "--via", "exec",
            "--exec", "nc {host} {port}", "--listen", f"127.0.0.1:{taken}", env=env,
        )  # fmt: skip
    assert failed.returncode == 2
    assert f"port {taken} on 127.0.0.1 is already in use" in " ".join(failed.stderr.split())


@pytest.mark.parametrize(("flag", "shown"), [("-v", True), ("-q", False)])
def test_verbosity(cluster: LocalCluster, tmp_path: Path, flag: str, shown: bool) -> None:
    """-v logs each broker's listener as it opens (INFO); -q only errors."""
    port = free_port_run(8)
    up = ManagedProcess(
        [
            sys.executable, "-m", "kafkatunnel", flag, "up",
            "--bootstrap", cluster.mock[0].address,
            "--via", "exec", "--exec", cluster.exec_template(),
            "--listen", f"127.0.0.1:{port}", "--no-table",
        ],
        name="kafkatunnel-up", env={"KAFKATUNNEL_STATE_DIR": str(tmp_path)},
    )  # fmt: skip
    try:
        up.wait_for_line(r"^broker 3: ", timeout=30)
        logged = any(f"-> 127.0.0.1:{port + 1}" in line and "broker 1" in line
                     for line in up.lines)  # fmt: skip
        assert logged is shown, up.output()
    finally:
        up.stop()


@pytest.mark.parametrize(
    ("flags", "protocol"),
    [([], "SASL_PLAINTEXT"), (["--client-tls"], "SASL_SSL")],
    ids=["through-its-listener", "client-tls-straight-through"],
)
def test_a_listener_that_wants_a_login_is_said_to_want_one(
    tmp_path: Path, flags: list[str], protocol: str
) -> None:
    """tansu with --authentication answers nothing but a login (it closes on Metadata), as
    a Kafka SASL listener does: up says the listener wants a login and that the brokers
    come once a client has logged in, not that it "could not list the brokers yet". Asked
    through the tunnel's own listener, and, with --client-tls, straight through the
    forwarder; tansu names no mechanism (it echoes the one asked for), so none is shown."""
    port = free_port_run(1)
    broker = start_tansu(port, f"127.0.0.1:{port}", authentication=True, silent=True)
    up = ManagedProcess(
        [sys.executable, "-m", "kafkatunnel", "up", "--no-table",
         "--bootstrap", f"127.0.0.1:{port}", "--exec", "socat STDIO TCP:{host}:{port}",
         "--listen", f"127.0.0.1:{free_port_run(8)}", *flags],
        name="kafkatunnel-up-login", env={"KAFKATUNNEL_STATE_DIR": str(tmp_path)},
    )  # fmt: skip
    try:
        up.wait_for_line(r"^bootstrap\.servers=", timeout=30)
        said = " ".join(up.output().split())
    finally:
        up.stop()
        broker.stop()
    assert "the bootstrap broker's listener wants a login (SASL) before it lists the brokers: " \
        "they are added when a client has logged in through the tunnel (clients set " \
        f"security.protocol={protocol})" in said, said  # fmt: skip
    assert "could not list the brokers" not in said, said
