"""Resolver set-up is always reversible: teardown leaves files byte for byte as they were."""

from __future__ import annotations

from pathlib import Path

import pytest

from kafkatunnel.dns.resolver import loopback_alias_commands, setup, state_file, teardown

pytestmark = pytest.mark.quick

NAMES = {
    "kafka-0.kafka-headless.demo.svc.cluster.local": "127.0.0.2",
    "kafka-0.kafka-headless": "127.0.0.2",
    "kafka-1.kafka-headless.demo.svc.cluster.local": "127.0.0.3",
}
DOMAINS = ["cluster.local", "demo.svc"]


@pytest.fixture(autouse=True)
def state(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("KAFKATUNNEL_STATE_DIR", str(tmp_path / "state"))


@pytest.mark.parametrize(
    "original",
    [b"127.0.0.1 localhost\n::1 localhost\n", b"127.0.0.1 localhost", b"", b"# only a comment\n\n"],
    ids=["plain", "no-final-newline", "empty", "comment"],
)
def test_hosts_block_round_trip(tmp_path: Path, original: bytes) -> None:
    hosts = tmp_path / "hosts"
    hosts.write_bytes(original)
    setup(method="hosts", names=NAMES, domains=DOMAINS, server=("127.0.0.1", 53), hosts_file=hosts)
    written = hosts.read_text()
    assert (
        "127.0.0.2 kafka-0.kafka-headless kafka-0.kafka-headless.demo.svc.cluster.local" in written
    )
    assert state_file().exists()
    teardown()
    assert hosts.read_bytes() == original
    assert not state_file().exists()


def test_hosts_block_survives_other_edits(tmp_path: Path) -> None:
    hosts = tmp_path / "hosts"
    hosts.write_bytes(b"127.0.0.1 localhost\n")
    setup(method="hosts", names=NAMES, domains=DOMAINS, server=("127.0.0.1", 53), hosts_file=hosts)
    hosts.write_bytes(hosts.read_bytes() + b"10.0.0.9 added-later\n")
    teardown()
    assert hosts.read_bytes() == b"127.0.0.1 localhost\n10.0.0.9 added-later\n"


def test_resolver_dir_round_trip(tmp_path: Path) -> None:
    resolver = tmp_path / "resolver"
    resolver.mkdir()
    (resolver / "demo.svc").write_bytes(b"nameserver 10.9.9.9\n")  # someone else's file
    before = {p.name: p.read_bytes() for p in resolver.iterdir()}
    setup(
        method="resolver-dir", names=NAMES, domains=DOMAINS, server=("127.0.0.1", 5353),
        resolver_dir=resolver,
    )  # fmt: skip
    assert (resolver / "cluster.local").read_text() == "nameserver 127.0.0.1\nport 5353\n"
    teardown()
    assert {p.name: p.read_bytes() for p in resolver.iterdir()} == before


def test_teardown_after_a_crash_uses_the_state_file(tmp_path: Path) -> None:
    """Set-up wrote its state before acting, so a fresh process can undo it."""
    hosts = tmp_path / "hosts"
    hosts.write_bytes(b"127.0.0.1 localhost\n")
    setup(method="hosts", names=NAMES, domains=DOMAINS, server=("127.0.0.1", 53), hosts_file=hosts)
    import subprocess
    import sys

    result = subprocess.run(
        [sys.executable, "-m", "kafkatunnel", "dns", "teardown"], capture_output=True, text=True,
        env={**__import__("os").environ},
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    assert "remove the managed block" in result.stdout
    assert hosts.read_bytes() == b"127.0.0.1 localhost\n"


def test_dry_run_changes_nothing(tmp_path: Path) -> None:
    hosts = tmp_path / "hosts"
    hosts.write_bytes(b"127.0.0.1 localhost\n")
    plan = setup(
        method="hosts", names=NAMES, domains=DOMAINS, server=("127.0.0.1", 53), hosts_file=hosts,
        dry_run=True,
    )  # fmt: skip
    assert plan.steps and hosts.read_bytes() == b"127.0.0.1 localhost\n"
    assert not state_file().exists()
    resolved = setup(
        method="systemd-resolved", names=NAMES, domains=DOMAINS, server=("127.0.0.1", 53),
        dry_run=True,
    )  # fmt: skip
    assert resolved.steps == [
        "ip link add kafkatunnel0 type dummy",
        "ip link set kafkatunnel0 up",
        "ip address add 169.254.53.53/32 dev kafkatunnel0",
        "resolvectl dns kafkatunnel0 127.0.0.1",
        "resolvectl domain kafkatunnel0 ~cluster.local ~demo.svc",
        "resolvectl default-route kafkatunnel0 false",
    ]


def test_a_second_setup_is_refused_until_teardown(tmp_path: Path) -> None:
    hosts = tmp_path / "hosts"
    hosts.write_bytes(b"")
    setup(method="hosts", names=NAMES, domains=DOMAINS, server=("127.0.0.1", 53), hosts_file=hosts)
    with pytest.raises(RuntimeError, match="dns teardown"):
        setup(
            method="hosts", names=NAMES, domains=DOMAINS, server=("127.0.0.1", 53), hosts_file=hosts
        )
    teardown()
    assert hosts.read_bytes() == b""


def test_macos_needs_loopback_aliases() -> None:
    assert loopback_alias_commands(["127.0.0.2"], "darwin") == [
        "sudo ifconfig lo0 alias 127.0.0.2 up"
    ]
    assert loopback_alias_commands(["127.0.0.2"], "linux") == []
