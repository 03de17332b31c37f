"""A cluster is input, not an authority: brokers that advertise hostile names, thousands of
brokers, and ports someone else holds, against the real `kafkatunnel up`.

The brokers are the test cluster's real ones; `tests.tunnel.hostile` sits in the --exec
forwarder and adds lying entries to their Metadata answers (kio-encoded)."""

from __future__ import annotations

import contextlib
import json
import os
import shlex
import socket
import subprocess
import sys
import uuid
from pathlib import Path

import pytest
from dnslib import RCODE, DNSRecord

from kafkatunnel.demo import LocalCluster, free_port, free_port_run
from kafkatunnel.demo.netns import NetworkNamespace
from kafkatunnel.demo.processes import ManagedProcess
from kafkatunnel.probe import ProbeConnection
from kafkatunnel.protocol import ProtocolError
from kafkatunnel.tunnel import ExecForwarder, TunnelConfig
from kafkatunnel.tunnel.background import BackgroundTunnel
from kafkatunnel.waiting import wait_for
from tests.kube.faults import every_group_works
from tests.tunnel.hostile import PUBLIC, hostile_exec, hostile_names, public_lookalikes

ROOT = Path(__file__).resolve().parents[2]


def up(
    bootstrap: str, template: str, tmp: Path, *args: str, prefix: list[str] | None = None
) -> ManagedProcess:
    argv = [
        sys.executable, "-m", "kafkatunnel", "up", "--bootstrap", bootstrap,
        "--exec", template, "--no-table", *args,
    ]  # fmt: skip
    return ManagedProcess(
        [*(prefix or []), *argv],
        name="hostile-up",
        env={"KAFKATUNNEL_STATE_DIR": str(tmp), "PYTHONPATH": str(ROOT)},
    )


def status(tmp: Path) -> dict[str, object]:
    result = subprocess.run(
        [sys.executable, "-m", "kafkatunnel", "status", "--json"],
        capture_output=True, text=True, timeout=30,
        env={**os.environ, "KAFKATUNNEL_STATE_DIR": str(tmp)},
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    state: dict[str, object] = json.loads(result.stdout)
    return state


def dns_answer(name: str, server: tuple[str, int]) -> DNSRecord:
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as sock:
        sock.settimeout(5)
        sock.sendto(DNSRecord.question(name, "A").pack(), server)
        return DNSRecord.parse(sock.recv(4096))


def test_hostile_names_are_refused_and_the_good_brokers_keep_working(
    cluster: LocalCluster, tmp_path: Path
) -> None:
    """The forwards run through `sh -c` (a template users write, e.g. around kubectl
    exec): a broker name that reached it unchecked would run `touch MARKER` as a command
    of its own, once a client connects to that broker."""
    marker = tmp_path / "p"
    spec = {"brokers": hostile_names(str(marker))}
    through_a_shell = f"sh -c {shlex.quote(cluster.exec_template())}"
    port, dns_port = free_port_run(8), free_port()
    tunnel = up(
        cluster.mock[0].address, hostile_exec(through_a_shell, spec, tmp_path), tmp_path,
        "--listen", f"127.0.0.1:{port}", "--dns", "--dns-listen", f"127.0.0.1:{dns_port}",
        "--dns-setup", "none",
    )  # fmt: skip
    try:
        tunnel.wait_for_line(
            r"^broker 104: .*\(not resolved: outside the cluster's zones", timeout=30
        )
        bootstrap = f"127.0.0.1:{port}"

        # a client at every broker it is told of: only served ones open a forward
        with ProbeConnection(bootstrap) as probe:
            told = {b.node_id: (b.host, b.port) for b in probe.brokers()}
        for host, broker_port in told.values():
            with (
                contextlib.suppress(OSError, ValueError, ProtocolError),
                ProbeConnection(f"{host}:{broker_port}", timeout=5) as each,
            ):
                each.brokers()
        assert not marker.exists(), "a broker's name ran as a shell command"

        # what a client is told: refused brokers never resolve, the rest are tunnel ports
        for node in (101, 102, 103):
            assert told[node][0] == f"refused-broker-n{node}.kafkatunnel.invalid", told
        host, broker_port = told[104]
        assert host == "127.0.0.1"
        socket.create_connection((host, broker_port), timeout=5).close()  # the tunnel's own

        state = status(tmp_path)
        refused = {r["node_id"]: r for r in state["refused"]}  # type: ignore[attr-defined]
        assert sorted(refused) == [101, 102, 103]
        assert "not a host name" in refused[101]["reason"]
        assert state["refused_total"] == 3
        [outside] = [e for e in state["endpoints"] if e["node_id"] == 104]  # type: ignore[attr-defined]
        assert "not resolved: outside the cluster's zones" in outside["note"]
        for endpoint in state["endpoints"]:  # type: ignore[attr-defined]
            if endpoint["node_id"] in (1, 2, 3):  # the mock brokers advertise 127.0.0.1
                assert endpoint["note"] == "advertised as an address: no name to resolve"
        names = state["dns"]["names"]  # type: ignore[index]
        assert not [n for n in names if "example" in n or "/" in n or "\n" in n], names
        answer = dns_answer("login.example.com", ("127.0.0.1", dns_port))
        assert answer.header.rcode == RCODE.REFUSED and not answer.rr

        every_group_works(cluster, bootstrap, f"hostile-{uuid.uuid4().hex[:6]}")
        refusals = [line for line in tunnel.lines if "refused broker" in line]
        assert len(refusals) == 1 and "and 2 more" in refusals[0], refusals  # one line
        assert not Path("/tmp/resolver-escape").exists()
    finally:
        tunnel.stop()


def test_hostile_names_in_the_hosts_file_method(cluster: LocalCluster, tmp_path: Path) -> None:
    """`up --dns --dns-setup hosts` in a namespace whose /etc/hosts is bind-mounted (as in
    containers: rename() onto it fails): only the cluster's names are written, none of the
    public names that brokers named like `github.com.x.svc` would derive, the shim answers
    none of those either, and the file is byte for byte what it was once the tunnel stops."""
    assert cluster.tansu is not None
    spec = {"brokers": hostile_names(str(tmp_path / "p")) + public_lookalikes()}
    with NetworkNamespace(hosts={"laptop.local": "127.0.1.1"}) as laptop:
        hosts_file = Path("/etc/netns") / laptop.name / "hosts"
        before = hosts_file.read_bytes()
        tunnel = up(
            cluster.tansu.address, hostile_exec(cluster.exec_template(), spec, tmp_path), tmp_path,
            "--dns", "--dns-listen", "127.0.0.1:53", "--dns-setup", "hosts",
            prefix=laptop.exec_prefix(),
        )  # fmt: skip
        try:
            tunnel.wait_for_line(r"^resolver: hosts: ", timeout=30)
            during = hosts_file.read_text()
            for bad in ("example", "evil", "6.6.6.6", "resolver-escape", "ProxyCommand"):
                assert bad not in during, during
            block = during.split("# BEGIN kafkatunnel", 1)[1].split("# END kafkatunnel")[0]
            written = {name for line in block.splitlines()[1:] for name in line.split()[1:]}
            assert not written & PUBLIC, during
            # the real cluster's names, short forms of the user's namespace included
            assert {cluster.tansu.host, "kafka-0.kafka-headless"} <= written, during

            def shim(name: str) -> str:
                asked = [*laptop.exec_prefix(), "dig", "@127.0.0.1", name, "A", "+noall",
                         "+answer", "+time=2", "+tries=1"]  # fmt: skip
                return subprocess.run(asked, capture_output=True, text=True, timeout=30).stdout

            assert "127.0.0." in shim(cluster.tansu.host)  # the shim answers...
            for name in sorted(PUBLIC):
                assert shim(name).strip() == "", name  # ...and never for a public name
            tunnel.stop()
        finally:
            tunnel.stop()
        assert tunnel.popen.returncode == 0, tunnel.lines
        assert hosts_file.read_bytes() == before


def test_five_thousand_brokers_leave_the_tunnel_bounded(
    cluster: LocalCluster, tmp_path: Path
) -> None:
    """The tunnel's own Metadata request is told of 5,000 more brokers: it serves at most
    --max-brokers of them, its descriptors stay bounded, and clients keep working."""
    spec = {"many": 5000, "client_id": "kafkatunnel"}
    port = free_port_run(8)
    tunnel = up(
        cluster.mock[0].address, hostile_exec(cluster.exec_template(), spec, tmp_path), tmp_path,
        "--listen", f"127.0.0.1:{port}", "--max-brokers", "40",
    )  # fmt: skip
    try:
        tunnel.wait_for_line(r"^broker 3: ", timeout=60)
        state = status(tmp_path)
        assert len(state["endpoints"]) == 1 + 40  # type: ignore[arg-type]
        assert state["refused_total"] == 5000 + 3 - 40
        assert "more than 40 brokers" in state["refused"][0]["reason"]  # type: ignore[index]
        descriptors = len(os.listdir(f"/proc/{tunnel.pid}/fd"))
        assert descriptors < 40 + 30, descriptors
        every_group_works(cluster, f"127.0.0.1:{port}", f"many-{uuid.uuid4().hex[:6]}")
    finally:
        tunnel.stop()


def test_ssh_gets_a_hostile_name_as_one_word(tmp_path: Path) -> None:
    """The real ssh (openssh-client) through an exec template: a name that used to add
    `-oProxyCommand=...` runs no command, as the name is one word of `-W`."""
    ssh = subprocess.run(["which", "ssh"], capture_output=True, text=True).stdout.strip()
    if not ssh:
        pytest.skip("openssh-client is not installed")
    marker = tmp_path / "p"
    forwarder = ExecForwarder("ssh -F /dev/null -o BatchMode=yes -W {host}:{port} bastion.invalid")
    host = f"x:1 -oProxyCommand=touch${{IFS}}{marker} -oUser="
    argv = forwarder.argv(host, 9092)
    assert argv[-2:] == [f"{host}:9092", "bastion.invalid"]
    result = subprocess.run(argv, capture_output=True, text=True, timeout=30)
    assert result.returncode != 0
    assert not marker.exists(), result.stderr


def test_a_taken_port_is_never_handed_to_clients(cluster: LocalCluster) -> None:
    """Broker 2's planned port is held by another program: it gets the next free one, and
    clients are only ever told ports the tunnel holds."""
    port = free_port_run(8)
    holder = socket.socket()
    holder.bind(("127.0.0.1", port + 2))
    holder.listen()
    config = TunnelConfig(bootstrap=cluster.mock[0].address, listen_port=port, control=False)
    try:
        with BackgroundTunnel(config, ExecForwarder(cluster.exec_template())) as tunnel:
            with ProbeConnection(tunnel.bootstrap_servers) as probe:
                told = {b.node_id: b.port for b in probe.brokers()}
            assert port + 2 not in told.values(), told
            held = {e.listen_port for e in tunnel.tunnel.registry.brokers.values()}
            assert set(told.values()) == held
            every_group_works(cluster, tunnel.bootstrap_servers, f"taken-{uuid.uuid4().hex[:6]}")
    finally:
        holder.close()


def test_a_bug_on_one_connection_closes_that_connection_only(cluster: LocalCluster) -> None:
    """An exception no input should cause (here: the address map failing once) ends the
    connection it happened on, with a message that says it is a bug; the event loop and
    every other connection go on."""
    config = TunnelConfig(
        bootstrap=cluster.mock[0].address, listen_port=free_port_run(8), control=False
    )
    with BackgroundTunnel(config, ExecForwarder(cluster.exec_template())) as tunnel:
        registry = tunnel.tunnel.registry
        healthy = registry.map
        with ProbeConnection(tunnel.bootstrap_servers) as bystander:  # opened before
            bystander.api_versions()

            def broken(address: object) -> tuple[str, int]:
                registry.map = healthy  # type: ignore[method-assign]
                raise RuntimeError("map failed")

            registry.map = broken  # type: ignore[method-assign]
            with (
                pytest.raises((ConnectionError, OSError)),
                ProbeConnection(tunnel.bootstrap_servers) as victim,
            ):
                victim.brokers()
            assert bystander.brokers()  # the other connection still answers
        [bootstrap] = [e for e in tunnel.status()["endpoints"] if e["node_id"] is None]
        assert "internal error: RuntimeError: map failed" in bootstrap["last_error"]
        assert "a kafkatunnel bug" in bootstrap["last_error"]
        every_group_works(cluster, tunnel.bootstrap_servers, f"bug-{uuid.uuid4().hex[:6]}")


def test_connections_past_the_limit_are_closed_at_accept(cluster: LocalCluster) -> None:
    """Each connection costs descriptors and, with --via exec, a process: past
    --max-connections new ones are closed at once, counted, and the open ones go on."""
    port = free_port_run(8)
    config = TunnelConfig(
        bootstrap=cluster.mock[0].address, listen_port=port, control=False, max_connections=2
    )
    with BackgroundTunnel(config, ExecForwarder(cluster.exec_template())) as tunnel:
        with (
            ProbeConnection(tunnel.bootstrap_servers) as first,
            ProbeConnection(tunnel.bootstrap_servers) as second,
        ):
            first.api_versions()
            second.api_versions()
            with socket.create_connection(("127.0.0.1", port), timeout=5) as third:
                assert third.recv(1) == b""  # closed by the tunnel, not left hanging
            assert tunnel.status()["turned_away"] == 1
            assert first.brokers() and second.brokers()
        wait_for(lambda: not tunnel.tunnel.connections, timeout=10, what="connections closed")
        with ProbeConnection(tunnel.bootstrap_servers) as again:  # room again
            assert again.brokers()


def test_hostile_names_in_transparent_mode(cluster: LocalCluster, tmp_path: Path) -> None:
    """Transparent mode learns brokers with its own plaintext request: refused names get
    nothing, a good name outside the zones gets no listener (it could only be reached by
    its name), and the cluster's own name resolves through the shim and serves."""
    assert cluster.tansu is not None
    spec = {"brokers": hostile_names(str(tmp_path / "p"))}
    dns_port = free_port()
    tunnel = up(
        cluster.tansu.address, hostile_exec(cluster.exec_template(), spec, tmp_path), tmp_path,
        "--mode", "transparent", "--dns", "--dns-listen", f"127.0.0.1:{dns_port}",
        "--dns-setup", "none", "--dns-first-address", "127.0.0.40",
    )  # fmt: skip
    try:
        tunnel.wait_for_line(r"^broker 104: ", timeout=30)
        state = status(tmp_path)
        assert sorted(r["node_id"] for r in state["refused"]) == [101, 102, 103]  # type: ignore[attr-defined]
        by_node = {e["node_id"]: e for e in state["endpoints"]}  # type: ignore[attr-defined]
        assert by_node[104]["state"] == "not resolved"
        names = state["dns"]["names"]  # type: ignore[index]
        assert cluster.tansu.host in names
        assert not [n for n in names if "example" in n or "/" in n or "\n" in n], names
        answer = dns_answer(cluster.tansu.host, ("127.0.0.1", dns_port))
        address = str(answer.rr[0].rdata)
        with ProbeConnection(f"{address}:{cluster.tansu.port}") as probe:  # through the tunnel
            assert probe.api_versions()
        assert (
            dns_answer("login.example.com", ("127.0.0.1", dns_port)).header.rcode == RCODE.REFUSED
        )
    finally:
        tunnel.stop()
