"""The one place that decides what a name from the network may be, and where it may
resolve: the rules themselves, on names real clusters use and names an attacker would."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from kafkatunnel.hostnames import ClusterZones, UntrustedName, check_address, check_host

GOOD = [
    "kafka-0.kafka-headless.shop.svc.cluster.local",
    "my-cluster-kafka-0.my-cluster-kafka-brokers.myproject.svc",  # Strimzi
    "b-1.msk.abc123.c2.kafka.eu-west-1.amazonaws.com",
    "KAFKA-0.Example.COM.",  # case and a trailing dot
    "10.0.0.5",
    "::1",
    "fe80::1",
    "a" * 63 + ".example",
]
BAD = [
    "x:1 -oProxyCommand=touch${IFS}/tmp/p -oUser=",  # options for ssh
    "evil\n6.6.6.6 evil.example.org",  # a line of /etc/hosts
    "kafka-3/../../etc/resolver/x",  # a path out of its directory
    "$(reboot)",
    "kafka;rm -rf ~",
    "kafka 0",
    "-oProxyCommand=x",  # a label may not start with a hyphen
    "kafka-.example",
    "kafka_0.example",  # RFC 1123 has no underscore
    "a" * 64 + ".example",
    ("a" * 60 + ".") * 5,  # over 253
    "",
    "..",
    "1.2.3",  # all digits, and no address
    "fe80::1%eth0",  # a scope id is arbitrary text
    "kafka\x00.example",
]


@pytest.mark.parametrize("name", GOOD)
def test_what_a_broker_may_be_called(name: str) -> None:
    assert check_host(name) == name


@pytest.mark.parametrize("name", BAD)
def test_what_a_broker_may_not_be_called(name: str) -> None:
    with pytest.raises(UntrustedName):
        check_host(name)


@pytest.mark.parametrize("port", [0, -1, 65536, 1 << 31])
def test_ports_out_of_range_are_refused(port: int) -> None:
    with pytest.raises(UntrustedName, match="between 1 and 65535"):
        check_address("kafka-0.example.com", port)


SHELL_OR_PATH = set(" \t\n\r/\\'\"`$;&|<>(){}[]*?!#~=%,\x00")


@given(st.text(max_size=80))
def test_an_accepted_name_holds_nothing_a_shell_or_a_path_would_read(text: str) -> None:
    try:
        check_host(text)
    except UntrustedName:
        return
    assert not set(text) & SHELL_OR_PATH


ZONES = ClusterZones.of(["kafka-0.kafka-headless.shop.svc.cluster.local"], ["corp.example"])


@pytest.mark.parametrize(
    ("name", "covered"),
    [
        ("kafka-3.kafka-headless.shop.svc.cluster.local", True),
        ("kafka-3.kafka-headless.other.svc", True),  # svc: the search path's form
        ("broker.corp.example", True),  # --dns-zone
        ("login.example.com", False),
        ("cluster.local.evil.com", False),
        ("localhost", False),
        ("kafka.localhost", False),
        ("10.0.0.5", False),  # an address needs no resolving
        ("corp.example.org", False),
    ],
)
def test_only_the_clusters_zones_resolve(name: str, covered: bool) -> None:
    assert ZONES.covers(name) is covered


def test_a_lone_label_or_tld_is_no_zone_unless_named() -> None:
    """`kafka-0.kafka` or `kafka.com` as bootstrap would make `kafka` or `com` a zone: too
    wide to derive. The user names such a zone with --dns-zone."""
    zones = ClusterZones.of(["kafka-0.kafka", "broker.com"])
    assert not zones.covers("kafka-1.kafka") and not zones.covers("login.com")
    assert ClusterZones.of(["kafka-0.kafka"], ["kafka"]).covers("kafka-1.kafka")
    with pytest.raises(UntrustedName):
        ClusterZones.of([], ["localhost/../x"])


def test_short_forms_and_routing_domains_follow_the_names_inside() -> None:
    full = "kafka-0.kafka-headless.shop.svc.cluster.local"
    names = [full, "kafka-0.kafka-headless", "kafka-0.kafka-headless.shop"]
    assert ZONES.refusal(names, ["cluster.local", "svc", "kafka-headless"]) is None
    assert "login.example.com" in str(ZONES.refusal([*names, "login.example.com"], []))
    assert "github.com" in str(ZONES.refusal(names, ["github.com"]))
    # a short form with no full name inside the zones behind it is no short form
    assert ZONES.refusal(["kafka-0.evil"], ["evil"]) is not None
