"""The real systemd-resolved (Debian 12's, 252) in front of the shim: the resolver most
Linux desktops have. It runs in a namespace playing the laptop, with a D-Bus system bus and
a /run of its own (scripts/test unpacks it; it is never installed here, because the package
would take over this machine's /etc/resolv.conf). The laptop's resolv.conf points at
resolved's stub, 127.0.0.53, as on Ubuntu or Fedora.

`up --dns --dns-setup systemd-resolved` gives the shim a link of its own, clients resolve
the brokers' names through resolved and reach them, and neither a clean exit nor `dns
teardown` after a crash leaves a link or a setting behind. On the loopback link resolved
refuses, as it does on every desktop."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from kafkatunnel.demo import TANSU_HOST, LocalCluster
from kafkatunnel.demo.netns import NetworkNamespace
from kafkatunnel.demo.processes import ManagedProcess
from kafkatunnel.waiting import wait_for
from tests.tunnel.hostile import PUBLIC, hostile_exec, public_lookalikes

RESOLVED = Path(sys.executable).parent.parent / "opt" / "systemd-resolved"
RESOLV_CONF = "nameserver 127.0.0.53\noptions edns0 trust-ad timeout:1 attempts:2\n"
BUS_CONFIG = """<!DOCTYPE busconfig PUBLIC "-//freedesktop//DTD D-Bus Bus Configuration 1.0//EN"
 "http://www.freedesktop.org/standards/dbus/1.0/busconfig.dtd">
<busconfig>
  <type>system</type>
  <listen>unix:path=/run/dbus/system_bus_socket</listen>
  <auth>EXTERNAL</auth>
  <policy context="default">
    <allow user="*"/><allow own="*"/><allow send_type="method_call"/>
    <allow send_destination="*"/><allow receive_sender="*"/>
  </policy>
</busconfig>
"""
# The namespace's own /run and a systemd-resolve user (only in its own view of /etc), a
# bus, and resolved; then it waits, so that commands can join its namespaces.
SANDBOX = """
mkdir -p {keep}/netns && mount --rbind /run/netns {keep}/netns  # ip netns exec needs them
mount -t tmpfs tmpfs /run && mkdir -p /run/dbus /run/systemd /run/netns
mount --rbind {keep}/netns /run/netns
cp /etc/passwd /run/passwd && cp /etc/group /run/group
grep -q '^systemd-resolve:' /run/passwd || echo 'systemd-resolve:x:990:990::/:/usr/sbin/nologin' >> /run/passwd
grep -q '^systemd-resolve:' /run/group || echo 'systemd-resolve:x:990:' >> /run/group
mount --bind /run/passwd /etc/passwd && mount --bind /run/group /etc/group
dbus-daemon --config-file={bus} --nofork --nopidfile &
until [ -S /run/dbus/system_bus_socket ]; do sleep 0.05; done
{resolved}/lib/systemd/systemd-resolved &
until {resolved}/usr/bin/resolvectl --no-pager status >/dev/null 2>&1; do sleep 0.05; done
echo READY
wait
"""  # noqa: E501


class Laptop:
    def __init__(self, namespace: NetworkNamespace, process: ManagedProcess, tmp: Path) -> None:
        self.namespace = namespace
        self.process = process
        self.env = {**os.environ, "PATH": f"{RESOLVED}/usr/bin:{os.environ['PATH']}",
                    "KAFKATUNNEL_STATE_DIR": str(tmp / "state")}  # fmt: skip

    def prefix(self) -> list[str]:
        return ["nsenter", f"--target={self.process.pid}", "--mount", "--net"]

    def run(self, *argv: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run([*self.prefix(), *argv], capture_output=True, text=True,
                              timeout=120, env=self.env)  # fmt: skip

    def links(self) -> str:
        return self.run("ip", "-brief", "link").stdout

    def resolve(self, name: str) -> str | None:
        result = self.run("getent", "hosts", name)
        return result.stdout.split()[0] if result.returncode == 0 and result.stdout else None


@pytest.fixture
def laptop(cluster: LocalCluster, tmp_path: Path) -> Iterator[Laptop]:
    assert (RESOLVED / "lib/systemd/systemd-resolved").exists(), (
        f"systemd-resolved is unpacked into {RESOLVED} by scripts/test"
    )
    bus = tmp_path / "bus.conf"
    bus.write_text(BUS_CONFIG)
    script = SANDBOX.format(bus=bus, resolved=RESOLVED, keep=tmp_path)
    with NetworkNamespace(resolv_conf=RESOLV_CONF) as namespace:
        process = ManagedProcess(
            [*namespace.exec_prefix(), "unshare", "--mount", "--propagation", "private",
             "bash", "-euc", script],
            name="laptop-resolved",
        )  # fmt: skip
        try:
            process.wait_for_line(r"^READY$", timeout=30)
            yield Laptop(namespace, process, tmp_path)
        finally:
            process.stop()


# The short forms' domains, named as zones: outside the zones they are no domains
SHORT_FORM_ZONES = ("--dns-zone", "kafka-headless", "--dns-zone", "kafka-headless.demo")


def _up(
    laptop: Laptop, cluster: LocalCluster, *args: str, template: str | None = None
) -> ManagedProcess:
    assert cluster.tansu is not None
    return ManagedProcess(
        [*laptop.prefix(), sys.executable, "-m", "kafkatunnel", "up",
         "--bootstrap", cluster.tansu.address, "--exec", template or cluster.exec_template(),
         "--mode", "transparent", "--dns", "--dns-listen", "127.0.0.1:5300", "--no-table",
         *args],
        name="laptop-tunnel", env=laptop.env,
    )  # fmt: skip


def test_resolved_refuses_the_loopback_link(laptop: Laptop) -> None:
    """What `resolvectl dns lo` does on a desktop (systemd 252 here): refused, and the
    message is lost to a fallback to networkd; hence a link of our own."""
    result = laptop.run("resolvectl", "dns", "lo", "127.0.0.1")
    assert result.returncode != 0, result


def test_up_routes_the_cluster_through_a_link_of_its_own(
    cluster: LocalCluster, laptop: Laptop
) -> None:
    tunnel = _up(laptop, cluster, "--dns-setup", "systemd-resolved", *SHORT_FORM_ZONES)
    try:
        tunnel.wait_for_line(r"^resolver: systemd-resolved: ", timeout=40)
        assert "kafkatunnel0" in laptop.links()
        link = laptop.run("resolvectl", "--no-pager", "status", "kafkatunnel0").stdout
        assert "127.0.0.1:5300" in link and "-DefaultRoute" in link, link
        for zone in ("~cluster.local", "~kafka-headless", "~svc"):
            assert zone in link, link
        for name in ("kafka-0.kafka-headless", "kafka-0.kafka-headless.demo", TANSU_HOST):
            assert laptop.resolve(name) == "127.0.0.2", (name, tunnel.output())
        assert laptop.resolve("example.invalid") is None  # nothing else goes to the shim

        topic = f"resolved-{uuid.uuid4().hex[:6]}"
        workload = [sys.executable, "-m", "kafkatunnel.demo.workload"]
        produced = laptop.run(*workload, "produce", "kafka-0.kafka-headless:9092", topic, "10")
        assert produced.stdout.strip() == "PRODUCED 10", produced.stderr[-2000:]
        consumed = laptop.run(*workload, "consume", TANSU_HOST + ":9092", f"{topic}-g", topic,
                              "10")  # fmt: skip
        assert consumed.stdout.startswith("CONSUMED 10"), consumed.stderr[-2000:]

        os.kill(tunnel.pid, signal.SIGTERM)
        assert tunnel.popen.wait(timeout=20) == 0
    finally:
        tunnel.stop()
    assert "kafkatunnel0" not in laptop.links()
    assert "kafkatunnel0" not in laptop.run("resolvectl", "--no-pager", "status").stdout
    assert laptop.resolve(TANSU_HOST) is None


def test_public_names_never_become_routing_domains(
    cluster: LocalCluster, laptop: Laptop, tmp_path: Path
) -> None:
    """Brokers named like `github.com.x.svc` and `xn--80ak6aa92e.com.shop.svc` (added to the
    real broker's Metadata by the lying filter): resolved is handed no public name as a
    routing domain (`~com` would send every .com query to the shim), the shim answers for
    no public name, and the cluster's own names still resolve."""
    spec = {"brokers": public_lookalikes()}
    template = hostile_exec(cluster.exec_template(), spec, tmp_path)
    tunnel = _up(laptop, cluster, "--dns-setup", "systemd-resolved", template=template)
    try:
        tunnel.wait_for_line(r"^resolver: systemd-resolved: ", timeout=40)
        link = laptop.run("resolvectl", "--no-pager", "domain", "kafkatunnel0").stdout
        routed = {word.lstrip("~") for word in link.split(":", 1)[1].split()}
        assert routed == {"cluster.local", "svc"}, (link, tunnel.output())  # only the zones
        assert laptop.resolve(TANSU_HOST) == "127.0.0.2", tunnel.output()
        assert laptop.resolve("kafka-0.kafka-headless") is None  # a short form: no domain
        for name in sorted(PUBLIC):
            asked = laptop.run("dig", "@127.0.0.1", "-p", "5300", name, "A", "+noall",
                               "+answer", "+time=2", "+tries=1")  # fmt: skip
            assert asked.stdout.strip() == "", (name, asked.stdout)
    finally:
        tunnel.stop()


def test_teardown_after_a_crash_removes_the_link(cluster: LocalCluster, laptop: Laptop) -> None:
    tunnel = _up(laptop, cluster, "--dns-setup", "systemd-resolved")
    try:
        tunnel.wait_for_line(r"^resolver: systemd-resolved: ", timeout=40)
        os.kill(tunnel.pid, signal.SIGKILL)
        tunnel.popen.wait(timeout=10)
    finally:
        tunnel.stop()
    assert "kafkatunnel0" in laptop.links()  # the crash left it
    undone = laptop.run(sys.executable, "-m", "kafkatunnel", "dns", "teardown")
    assert undone.returncode == 0 and "ip link del kafkatunnel0" in undone.stdout, undone
    wait_for(lambda: "kafkatunnel0" not in laptop.links(), timeout=5, what="the link to go")
    assert "kafkatunnel0" not in laptop.run("resolvectl", "--no-pager", "status").stdout


def test_without_privilege_auto_falls_back_and_says_why(laptop: Laptop, tmp_path: Path) -> None:
    """Creating a link needs CAP_NET_ADMIN (root here, so that capability is dropped):
    without it, `auto` says what failed and writes a hosts block instead (here to a file
    of the test's own)."""
    hosts = tmp_path / "hosts"
    hosts.write_text("127.0.0.1 localhost\n")
    code = (
        "from pathlib import Path; from kafkatunnel.dns.resolver import setup, teardown; "
        f"plan = setup(method='auto', names={{'kafka-0.kafka-headless': '127.0.0.2'}}, "
        f"domains=['kafka-headless'], server=('127.0.0.1', 5300), hosts_file=Path('{hosts}')); "
        "print(plan.method, plan.notes); teardown()"
    )
    result = laptop.run("setpriv", "--bounding-set=-net_admin", "--inh-caps=-net_admin",
                        sys.executable, "-c", code)  # fmt: skip
    assert result.returncode == 0, result.stderr
    assert result.stdout.startswith("hosts "), result.stdout
    assert "systemd-resolved did not take it" in result.stdout
    assert "ip link add kafkatunnel0 type dummy" in result.stdout  # the command that failed
    assert hosts.read_text() == "127.0.0.1 localhost\n"  # and teardown undid the block
    assert "kafkatunnel0" not in laptop.links()


def test_status_names_the_zones_resolved_routes(cluster: LocalCluster, laptop: Laptop) -> None:
    tunnel = _up(laptop, cluster, "--dns-setup", "none")
    try:
        tunnel.wait_for_line(r"^broker \d+: ", timeout=40)
        status = json.loads(laptop.run(sys.executable, "-m", "kafkatunnel", "status",
                                       "--json").stdout)  # fmt: skip
        assert set(status["dns"]["zones"]) == {"cluster.local", "svc"}
    finally:
        tunnel.stop()


def test_up_says_why_resolved_could_not_be_set_up(cluster: LocalCluster, laptop: Laptop) -> None:
    """Asked for systemd-resolved by name and unable (no CAP_NET_ADMIN): the command's own
    error and the fix, exit 2, nothing left behind."""
    assert cluster.tansu is not None
    result = laptop.run(
        "setpriv", "--bounding-set=-net_admin", "--inh-caps=-net_admin",
        sys.executable, "-m", "kafkatunnel", "up", "--bootstrap", cluster.tansu.address,
        "--exec", cluster.exec_template(), "--mode", "transparent", "--dns",
        "--dns-listen", "127.0.0.1:5300", "--dns-setup", "systemd-resolved", "--no-table",
    )  # fmt: skip
    output = result.stdout + result.stderr
    assert result.returncode == 2, output
    assert "`ip link add kafkatunnel0 type dummy` exited with 2" in output, output
    assert "Operation not permitted" in output and "--dns-setup hosts" in output, output
    assert "Traceback" not in output
    assert "kafkatunnel0" not in laptop.links()
