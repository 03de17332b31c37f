"""Real resolvers in front of the shim, as desktops and teams run them: unbound 1.17 (Debian
12) with a stub zone per cluster zone, RFC 8020 hardening and strict qname minimisation
(RFC 9156: it asks for each name on the way down from the apex and stops at the first
NXDOMAIN; `harden-below-nxdomain` alone acts only on DNSSEC-secure answers, says unbound's
manual), and dnsmasq 2.90 with `server=/zone/shim`. Inside a namespace playing the laptop:
its resolv.conf points at the resolver, the resolver at the shim, the tunnel runs in
transparent mode. Every form of the broker's name resolves before and after negative
answers in the zone, and a client that knows the broker only by name produces and consumes
through the tunnel. (With NXDOMAIN for empty non-terminals, as the shim once answered,
unbound here cannot resolve `kafka-0.kafka-headless.demo.svc` at all.) The short forms'
domains are named as zones (`--dns-zone`): outside the zones they are no domains."""

from __future__ import annotations

import json
import os
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

SHIM = ("127.0.0.1", 5300)
RESOLV_CONF = "nameserver 127.0.0.1\noptions timeout:1 attempts:2\n"
FORMS = [
    "kafka-0.kafka-headless",
    "kafka-0.kafka-headless.demo",
    "kafka-0.kafka-headless.demo.svc",
    TANSU_HOST,
    "KAFKA-0.Kafka-Headless.demo.svc.cluster.local",
]
# Names that exist without an address (empty non-terminals), and names that do not exist:
# a hardened resolver must not take either kind to mean that the brokers do not exist.
EMPTY = ["demo.svc.cluster.local", "kafka-headless.demo.svc.cluster.local", "svc.cluster.local"]
MISSING = ["kafka-7.kafka-headless.demo.svc.cluster.local", "nothing.demo.svc.cluster.local",
           "kafka-7.kafka-headless"]  # fmt: skip


def unbound(directory: Path, zones: list[str]) -> list[str]:
    stubs = "".join(
        f'stub-zone:\n  name: "{zone}."\n  stub-addr: {SHIM[0]}@{SHIM[1]}\n' for zone in zones
    )
    config = directory / "unbound.conf"
    config.write_text(f"""server:
  interface: 127.0.0.1
  port: 53
  do-ip6: no
  access-control: 127.0.0.0/8 allow
  do-not-query-localhost: no
  harden-below-nxdomain: yes
  qname-minimisation: yes
  qname-minimisation-strict: yes
  module-config: "iterator"
  chroot: ""
  username: ""
  directory: "{directory}"
  pidfile: "{directory}/unbound.pid"
  use-syslog: no
  logfile: ""
  verbosity: 1
{stubs}""")
    return ["unbound", "-d", "-c", str(config)]


def dnsmasq(directory: Path, zones: list[str]) -> list[str]:
    servers = [f"--server=/{zone}/{SHIM[0]}#{SHIM[1]}" for zone in zones]
    return ["dnsmasq", "--keep-in-foreground", "--log-facility=-", "--log-queries",
            "--no-resolv", "--no-hosts", "--listen-address=127.0.0.1", "--bind-interfaces",
            "--port=53", "--user=root",
            f"--pid-file={directory}/dnsmasq.pid", *servers]  # fmt: skip


RESOLVERS = {"unbound": unbound, "dnsmasq": dnsmasq}


@pytest.fixture
def laptop(cluster: LocalCluster) -> Iterator[NetworkNamespace]:
    with NetworkNamespace(resolv_conf=RESOLV_CONF) as namespace:
        yield namespace


def _run(laptop: NetworkNamespace, *argv: str, **env: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([*laptop.exec_prefix(), *argv], capture_output=True, text=True,
                          timeout=120, env={**os.environ, **env})  # fmt: skip


def _resolve(laptop: NetworkNamespace, name: str) -> str | None:
    """The address the laptop's own resolver path (resolv.conf, glibc) gives, or None.
    (`getent hosts`: getaddrinfo's AI_ADDRCONFIG would see only loopback here, and ask
    nobody.)"""
    result = _run(laptop, "getent", "hosts", name)
    return result.stdout.split()[0] if result.returncode == 0 and result.stdout else None


def _dig_status(laptop: NetworkNamespace, name: str) -> str:
    out = _run(laptop, "dig", "@127.0.0.1", name, "A", "+tries=1", "+time=3").stdout
    return out.split("status: ", 1)[1].split(",", 1)[0] if "status: " in out else out


@pytest.mark.parametrize("resolver", sorted(RESOLVERS))
def test_names_resolve_through_a_real_resolver(
    cluster: LocalCluster, laptop: NetworkNamespace, tmp_path: Path, resolver: str
) -> None:
    assert cluster.tansu is not None
    env = {"KAFKATUNNEL_STATE_DIR": str(tmp_path / "state")}
    tunnel = ManagedProcess(
        [*laptop.exec_prefix(), sys.executable, "-m", "kafkatunnel", "up",
         "--bootstrap", cluster.tansu.address, "--exec", cluster.exec_template(),
         "--mode", "transparent", "--dns", "--dns-listen", f"{SHIM[0]}:{SHIM[1]}",
         "--dns-setup", "none", "--no-table",
         "--dns-zone", "kafka-headless", "--dns-zone", "kafka-headless.demo"],
        name="laptop-tunnel", env=env,
    )  # fmt: skip
    server = None
    try:
        tunnel.wait_for_line(r"^broker \d+: 127\.0\.0\.2:9092 ", timeout=30)
        status = json.loads(_run(laptop, sys.executable, "-m", "kafkatunnel", "status",
                                 "--json", **env).stdout)  # fmt: skip
        zones = status["dns"]["zones"]
        assert {"cluster.local", "kafka-headless"} <= set(zones), zones
        server = ManagedProcess(
            [*laptop.exec_prefix(), *RESOLVERS[resolver](tmp_path, zones)], name=resolver
        )
        wait_for(lambda: _dig_status(laptop, TANSU_HOST) == "NOERROR", timeout=20,
                 what=f"{resolver} to answer")  # fmt: skip

        for name in FORMS:
            assert _resolve(laptop, name) == "127.0.0.2", (name, server.output())
        # A hardened resolver remembers a NXDOMAIN above the brokers and denies all below.
        empty = {name: _dig_status(laptop, name) for name in EMPTY}
        for name in MISSING:
            assert _dig_status(laptop, name) == "NXDOMAIN", name
            assert _resolve(laptop, name) is None
        for name in FORMS:
            assert _resolve(laptop, name) == "127.0.0.2", (name, server.output())
        assert empty == dict.fromkeys(EMPTY, "NOERROR")

        topic = f"by-name-{uuid.uuid4().hex[:6]}"
        workload = [sys.executable, "-m", "kafkatunnel.demo.workload"]
        produced = _run(laptop, *workload, "produce", cluster.tansu.address, topic, "20")
        assert produced.stdout.strip() == "PRODUCED 20", produced.stderr[-2000:]
        consumed = _run(laptop, *workload, "consume", "kafka-0.kafka-headless:9092",
                        f"{topic}-g", topic, "20")  # fmt: skip
        assert consumed.returncode == 0, consumed.stderr[-2000:]
        assert consumed.stdout.strip().startswith("CONSUMED 20"), consumed.stdout
    finally:
        if server is not None:
            server.stop()
        tunnel.stop()
