"""Plain captures as users make them: a laptop whose clients reach the cluster through
relays (port-forwards, socat, a bastion) on addresses of their own, captured with tcpdump on
the laptop's network interface, no kafkatunnel anywhere.

Three namespaces: the cluster's (brokers advertise 127.0.0.1:PORT, or tansu's Kubernetes
name), a relay host (10.77.N.2, one address per relay, socat into the cluster), and the
laptop (10.77.N.1). The laptop's kernel sends each advertised 127.0.0.1:PORT to its relay
(nftables DNAT, as a hosts entry sends a broker's name to a port-forward), so the capture
shows connections to relay addresses while the brokers advertise others. A relay may carry
its connections to one broker, to the wrong one, or to two brokers in turn.
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import threading
from pathlib import Path

from kafkatunnel.demo import LocalCluster
from kafkatunnel.demo.netns import NetworkNamespace
from kafkatunnel.demo.processes import ManagedProcess
from kafkatunnel.waiting import DeadlineExceeded, wait_for

RELAY_PORT = 9092
CAPTURE_BUFFER_KIB = 32768  # tcpdump -B: some 500 packets' slots (see _capture)
_subnets = iter(range(77, 200))
_lock = threading.Lock()


def _run(*argv: str) -> None:
    result = subprocess.run(list(argv), capture_output=True, text=True)
    if result.returncode != 0:
        raise RuntimeError(f"`{' '.join(argv)}` failed: {result.stderr.strip()}")


class RelayedLaptop:
    """`routes`: the cluster broker index each advertised mock address leads to (a list of
    several: each new connection goes to the next of them); `dns`: names the laptop resolves
    through a DNS server on the relay host, each to a relay of its own into tansu."""

    def __init__(
        self,
        cluster: LocalCluster,
        routes: dict[int, list[int]],
        capture: Path,
        dns: list[str] | None = None,
    ) -> None:
        with _lock:
            subnet = next(_subnets)
        self.cluster = cluster
        self.net = f"10.77.{subnet}"
        self.capture = capture
        self.processes: list[ManagedProcess] = []
        resolv = f"nameserver {self.net}.2\n" if dns else None
        self.laptop = NetworkNamespace(resolv_conf=resolv)
        self.relays = NetworkNamespace()
        self.relay_address = {i: f"{self.net}.{10 + i}" for i in routes}
        self.named = {name: f"{self.net}.{100 + i}" for i, name in enumerate(dns or [])}
        try:
            self._wire(routes, dns or [])
            self._capture()
        except BaseException:
            self.close()
            raise

    @property
    def bootstrap(self) -> str:
        return self.cluster.mock[0].address

    def _wire(self, routes: dict[int, list[int]], names: list[str]) -> None:
        short = f"{os.getpid() % 100000}{self.net.rsplit('.', 1)[1]}"
        self.veth = f"ktl{short}"[:15]
        peer = f"ktr{short}"[:15]
        _run("ip", "link", "add", self.veth, "type", "veth", "peer", "name", peer)
        _run("ip", "link", "set", self.veth, "netns", self.laptop.name)
        _run("ip", "link", "set", peer, "netns", self.relays.name)
        _run("ip", "-n", self.laptop.name, "addr", "add", f"{self.net}.1/24", "dev", self.veth)
        _run("ip", "-n", self.laptop.name, "link", "set", self.veth, "up")
        _run("ip", "-n", self.relays.name, "addr", "add", f"{self.net}.2/24", "dev", peer)
        for address in [*self.relay_address.values(), *self.named.values()]:
            _run("ip", "-n", self.relays.name, "addr", "add", f"{address}/24", "dev", peer)
        _run("ip", "-n", self.relays.name, "link", "set", peer, "up")
        for index, targets in routes.items():
            ports = [self.cluster.mock[t].port for t in targets]
            self._relay(self.relay_address[index], ports)
        for address in self.named.values():
            assert self.cluster.tansu is not None  # it listens on the port it advertises
            self._relay(address, [self.cluster.tansu.port], self.cluster.tansu.port)
        if names:
            records = [f"--address=/{name}/{address}" for name, address in self.named.items()]
            self.processes.append(ManagedProcess(
                [*self.relays.exec_prefix(), "dnsmasq", "--no-daemon", "--no-resolv",
                 "--no-hosts", f"--listen-address={self.net}.2", "--bind-interfaces",
                 "--log-facility=-", *records],
                name="relay-dns",
            ))  # fmt: skip
            self.processes[-1].wait_for_line(r"started, version", timeout=10)
        rules = "\n".join(
            f"ip daddr 127.0.0.1 tcp dport {self.cluster.mock[i].port} "
            f"dnat to {address}:{RELAY_PORT}"
            for i, address in self.relay_address.items()
        )
        nat = (
            "table ip relays {\n"
            f"  chain output {{ type nat hook output priority -100;\n{rules}\n  }}\n"
            "  chain postrouting { type nat hook postrouting priority 100; "
            f'oifname "{self.veth}" masquerade; }}\n'
            "}\n"
        )
        inside = self.laptop.exec_prefix()
        _run(*inside, "sysctl", "-qw", "net.ipv4.conf.all.route_localnet=1")
        result = subprocess.run([*inside, "nft", "-f", "-"], input=nat, capture_output=True,
                                text=True)  # fmt: skip
        if result.returncode != 0:
            raise RuntimeError(f"nft: {result.stderr.strip()}")

    def _relay(self, address: str, ports: list[int], listen: int = RELAY_PORT) -> None:
        """socat on address:listen into the cluster, to each of `ports` in turn."""
        inside = " ".join(self.cluster.inside([]))
        if len(ports) == 1:
            target = f"EXEC:{inside} socat STDIO TCP\\:127.0.0.1\\:{ports[0]}"
        else:
            script = self.capture.with_name(f"{self.capture.stem}-{address}.py")
            script.write_text(_ALTERNATE.format(inside=inside.split(), ports=ports,
                                                counter=f"{script}.count"))  # fmt: skip
            target = f"EXEC:{sys.executable} {script}"
        self.processes.append(ManagedProcess(
            [*self.relays.exec_prefix(), "socat",
             f"TCP-LISTEN:{listen},bind={address},fork,reuseaddr", target],
            name=f"relay-{address}",
        ))  # fmt: skip
        wait_for(lambda: self._accepting(address, listen), timeout=10,
                 what=f"the relay on {address}")  # fmt: skip

    def _accepting(self, address: str, port: int) -> bool:
        with self.relays.connect(address, port):
            return True

    def _capture(self) -> None:
        # In immediate mode libpcap gives each packet a ring slot sized for the largest one
        # the interface can hand it (64 KiB: a veth offloads segmentation), so tcpdump's
        # default 2 MiB holds 32 packets: consumers starting at once overflow it whenever
        # tcpdump waits for a CPU, and the kernel drops the packets that do not fit.
        self.tcpdump = ManagedProcess(
            [*self.laptop.exec_prefix(), "tcpdump", "-i", self.veth, "--immediate-mode", "-U",
             "-B", str(CAPTURE_BUFFER_KIB), "-s", "0", "-n", "-w", str(self.capture),
             "tcp or port 53"],
            name="tcpdump",
        )  # fmt: skip
        self.tcpdump.wait_for_line(r"listening on", timeout=10)

    def run(self, *argv: str, timeout: float = 120) -> subprocess.CompletedProcess[str]:
        """A command on the laptop (a client, say)."""
        return subprocess.run([*self.laptop.exec_prefix(), *argv], capture_output=True,
                              text=True, timeout=timeout)  # fmt: skip

    def finish(self) -> Path:
        """Stop the capture once tcpdump has written every packet its filter took, and
        return the file; or fail if the kernel dropped any: a capture that lost packets
        reaches verify as connections missing their middle, whose groups it cannot judge.

        Stopped at once, tcpdump would leave unwritten what is still in its ring (the
        closing packets of the last client, when it waits for a CPU): its SIGINT breaks the
        loop, and the kernel's count of packets the filter took includes those never read."""
        taken = self._counts()[1]  # by the filter when the clients were done
        written: list[tuple[int, ...]] = []

        def caught_up() -> bool:
            written[:] = [self._counts()]
            captured, _, dropped = written[0]
            return captured + dropped >= taken

        try:
            wait_for(caught_up, timeout=30, interval=0.1,
                     what=f"tcpdump to write the {taken} packets its filter had taken")  # fmt: skip
        except DeadlineExceeded as late:
            raise DeadlineExceeded(f"{late}; written, taken, dropped when last asked: "
                                   f"{written}") from None  # fmt: skip
        self.tcpdump.popen.send_signal(signal.SIGINT)
        self.tcpdump.popen.wait(10)
        counts = {
            what: int(self.tcpdump.wait_for_line(rf"^(\d+) packets? {what}$", timeout=10)[1])
            for what in ("captured", "received by filter", "dropped by kernel")
        }
        if counts["dropped by kernel"]:
            raise RuntimeError(
                f"the kernel dropped {counts['dropped by kernel']} of the packets tcpdump's "
                f"filter took (its {CAPTURE_BUFFER_KIB} KiB buffer overflowed): "
                f"{self.capture} is incomplete"
            )
        return self.capture

    def _counts(self) -> tuple[int, ...]:
        """tcpdump's counts now: written, taken by the filter, dropped by the kernel. SIGUSR1
        makes tcpdump (4.99) print them on one line and go on. Packets go on coming (a
        client's connection closing, a retransmission): the drain waits for those taken
        before it began, never for a moment with none in flight."""
        said = len(self._counts_said())
        self.tcpdump.popen.send_signal(signal.SIGUSR1)
        counts: tuple[int, ...] = wait_for(lambda: self._counts_said()[said:], timeout=10,
                                           what="tcpdump to print its counts")[0]  # fmt: skip
        return counts

    def _counts_said(self) -> list[tuple[int, ...]]:
        return [tuple(map(int, m.groups())) for line in list(self.tcpdump.lines)
                if (m := COUNTS.match(line))]  # fmt: skip

    def close(self) -> None:
        for process in [*self.processes, *([self.tcpdump] if hasattr(self, "tcpdump") else [])]:
            process.stop()
        self.laptop.close()
        self.relays.close()


# tcpdump's counts when asked with SIGUSR1 (info(0) in tcpdump.c): written, taken by the
# filter (the kernel's count, with packets not yet read), dropped by the kernel
COUNTS = re.compile(r"^tcpdump: (\d+) packets? captured, (\d+) packets? received by filter, "
                    r"(\d+) packets? dropped by kernel$")  # fmt: skip

_ALTERNATE = """
import fcntl, os
with open({counter!r}, "a+") as f:
    fcntl.flock(f, fcntl.LOCK_EX)
    f.seek(0)
    n = len(f.read())
    f.write("x")
port = {ports}[n % len({ports})]
os.execvp("{inside[0]}", {inside} + ["socat", "STDIO", f"TCP:127.0.0.1:{{port}}"])
"""
