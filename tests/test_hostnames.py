"""The one place that decides what a name from the network may be, and where it may
resolve: the rules themselves, on names real clusters use and names an attacker would."""

from __future__ import annotations

import re

import pytest
from hypothesis import given
from hypothesis import strategies as st

from kafkatunnel.hostnames import (
    ClusterZones,
    UntrustedName,
    check_address,
    check_host,
    join_address,
    kubernetes_name,
    public_suffix,
    split_address,
)
from tests.tunnel.hostile import PUBLIC, PUBLIC_LOOKALIKES

pytestmark = pytest.mark.quick

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


@pytest.mark.parametrize(
    ("address", "parts"),
    [("kafka-0.kafka:9092", ("kafka-0.kafka", 9092)), ("127.0.0.1:1", ("127.0.0.1", 1)),
     ("[::1]:9092", ("::1", 9092)), ("[fe80::1]:65535", ("fe80::1", 65535))],
)  # fmt: skip
def test_an_address_is_host_and_port_an_ipv6_host_in_brackets(
    address: str, parts: tuple[str, int]
) -> None:
    assert split_address(address) == parts
    assert join_address(*parts) == address  # what the tunnel writes reads back


@pytest.mark.parametrize(
    ("address", "said"),
    [("[::1:9092", "opens a bracket it does not close"),
     ("[::1", "opens a bracket it does not close"),
     ("::1]:9092", "brackets that do not pair"),
     ("[::1]]:9092", "brackets that do not pair"),
     ("[[::1]:9092", "brackets that do not pair"),
     ("kafka]:9092", "brackets that do not pair"),
     ("::1:9092", "an IPv6 host goes in brackets: write [::1]:9092"),
     ("fe80::1:19092", "write [fe80::1]:19092"),
     ("::1", "has no port: write an IPv6 host with its port as [::1]:PORT"),
     ("a:b:9092", "an IPv6 host goes in brackets, e.g. [::1]:9092"),
     ("[::1]", "a port goes after the ']'"),
     ("[::1]9092", "a port goes after the ']'"),
     ("[kafka]:9092", "brackets hold an IPv6 address, not 'kafka'"),
     ("[]:9092", "the host is missing"),
     (":9092", "the host is missing"),
     ("kafka", "is not HOST:PORT"),
     ("[::1]:0", "port 0 is not between 1 and 65535"),
     ("[::1]:²", "port '²' is not a number")],
)  # fmt: skip
def test_an_address_whose_brackets_do_not_pair_or_whose_ipv6_host_is_bare_is_refused(
    address: str, said: str
) -> None:
    with pytest.raises(ValueError, match=re.escape(said)):
        split_address(address)


def test_a_default_port_lets_the_port_be_left_out_but_not_the_brackets() -> None:
    assert split_address("idp.example", default_port=443) == ("idp.example", 443)
    assert split_address("[::1]", default_port=443) == ("::1", 443)
    assert split_address("[::1]:8443", default_port=443) == ("::1", 8443)
    for bad in ("::1", "[::1", "::1]", "[::1]x"):
        with pytest.raises(ValueError):
            split_address(bad, default_port=443)


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


def test_short_forms_follow_the_names_inside_and_give_no_domain() -> None:
    """The short forms are names (/etc/hosts holds them), never domains: the broker picked
    `kafka-headless`, and could as well have picked `corp`. A zone the user names makes
    them domains: `--dns-zone kafka-headless`."""
    full = "kafka-0.kafka-headless.staging.svc.cluster.local"
    zones = ClusterZones.of([full], ["corp.example"])
    names = [full, "kafka-0.kafka-headless", "kafka-0.kafka-headless.staging"]
    granted = zones.names_of(full)
    assert set(granted.forms) == {*names, "kafka-0.kafka-headless.staging.svc"}
    assert granted.suffixes == {"cluster.local", "svc.cluster.local", "svc", "staging.svc"}
    assert zones.refusal(names, ["cluster.local", "svc", "staging.svc"]) is None
    for domain in ("kafka-headless", "kafka-headless.staging"):
        assert zones.refusal(names, [domain]) == (
            f"domain {domain!r} is outside the cluster's zones (cluster.local, corp.example, svc)"
        )
    assert "'login.example.com' is outside" in str(zones.refusal([*names, "login.example.com"], []))
    assert "domain 'github.com' is outside" in str(zones.refusal(names, ["github.com"]))
    # a short form with no full name inside the zones behind it is no short form
    assert zones.refusal(["kafka-0.evil"], []) == (
        "'kafka-0.evil' is outside the cluster's zones (cluster.local, corp.example, svc)"
    )
    named = ClusterZones.of([full], ["kafka-headless", "staging"])
    assert {"kafka-headless", "kafka-headless.staging"} <= named.names_of(full).suffixes
    assert named.refusal(names, ["kafka-headless", "kafka-headless.staging"]) is None
    service = named.names_of("schema-registry.staging.svc")  # a service: NAME.NS is in NS
    assert service.suffixes & {"staging", "schema-registry.staging"} == {"staging"}


@pytest.mark.parametrize("tld", ["lan", "corp", "internal", "home.arpa"])
def test_a_broker_at_a_zones_apex_takes_no_domain_outside_the_zones(tld: str) -> None:
    """Bootstrap `kafka-1.team.mycorp.lan` gives the zone `team.mycorp.lan`; a broker
    advertised as `team.mycorp.lan` is found under itself, never under `mycorp.lan`, which
    would make the shim answer NXDOMAIN for the rest of the company's names. Private TLDs
    are on no public suffix list: the zones are the only bound."""
    zones = ClusterZones.of([f"kafka-1.team.mycorp.{tld}"])
    assert f"team.mycorp.{tld}" in zones.zones and f"mycorp.{tld}" not in zones.zones
    apex = zones.names_of(f"team.mycorp.{tld}")
    assert apex.forms == apex.suffixes == {f"team.mycorp.{tld}"}
    assert zones.names_of(f"kafka-2.team.mycorp.{tld}").suffixes == {f"team.mycorp.{tld}"}
    assert zones.names_of(f"b.rack-1.team.mycorp.{tld}").suffixes == {f"rack-1.team.mycorp.{tld}"}
    # the root helper refuses what a tunnel with the old rule would have asked for
    names = [f"kafka-1.team.mycorp.{tld}", f"team.mycorp.{tld}"]
    assert zones.refusal(names, [f"team.mycorp.{tld}"]) is None
    assert zones.refusal(names, [f"mycorp.{tld}"]) == (
        f"domain 'mycorp.{tld}' is outside the cluster's zones "
        f"(cluster.local, svc, team.mycorp.{tld})"
    )


def test_local_and_single_labels_are_never_domains() -> None:
    """`local` is multicast DNS's (RFC 6762) and a lone label is a whole TLD: neither is a
    domain a broker's name (or a user's, but for `--dns-zone`) can give. `cluster.local`
    stays a zone."""
    zones = ClusterZones.of(["kafka-0.kafka.myns.svc.cluster.local"])
    for advertised in ("kafka-0.local.myns.svc", "kafka-0.corp.myns.svc", "corp.myns.svc"):
        granted = zones.names_of(advertised)
        assert all("." in s and s != "local" for s in granted.suffixes - {"svc"}), granted
        assert granted.suffixes <= {"svc", "myns.svc", "local.myns.svc", "corp.myns.svc",
                                    "svc.cluster.local", "cluster.local"}  # fmt: skip
    assert "kafka-0.local" in zones.names_of("kafka-0.local.myns.svc").forms  # a name, still
    assert zones.refusal(["kafka-0.local"], ["local"]) is not None
    for user_name in ("kafka-0.kafka.myns.svc.local", "kafka-0.kafka.myns.svc.mycluster",
                      "kafka-0.local", "broker.corp"):  # fmt: skip
        assert ClusterZones.of([user_name]).zones == {"cluster.local", "svc"}, user_name
    with pytest.raises(UntrustedName, match=r"'local' is multicast DNS's \(RFC 6762\)"):
        ClusterZones.of([], ["local"])
    with pytest.raises(UntrustedName, match=r"'local' is multicast DNS's \(RFC 6762\)"):
        ClusterZones.of([], cluster_domain="local")
    assert ClusterZones.of([], ["kafka"]).names_of("kafka-0.kafka").suffixes == {"kafka"}


@pytest.mark.parametrize("name", ["kafka.shop.svc.com", "kafka-0.kafka.shop.svc.co.uk"])
def test_a_kubernetes_name_in_a_public_suffix_is_refused(name: str) -> None:
    """`kafka.shop.svc.com` is a public name shaped like a Kubernetes one: its "cluster
    domain" `com` would be a zone. Refused, saying why."""
    with pytest.raises(UntrustedName, match=r"cluster domain '(com|co\.uk)' is a public suffix"):
        ClusterZones.of([name])


def test_the_forms_kept_are_inside_the_zones_or_public_nowhere() -> None:
    """Each condition on a form on its own: inside a zone it resolves even where the public
    suffix list holds it; outside, only where no public suffix does; never `localhost`."""
    inside = ClusterZones.of(["b0.kafka.example.com"])  # zone kafka.example.com, under `com`
    assert inside.names_of("b1.kafka.example.com").forms == {"b1.kafka.example.com"}
    zones = ClusterZones.of(["kafka-0.kafka.myns.svc"])
    assert zones.names_of("kafka-0.localhost.myns.svc").forms == {
        "kafka-0.localhost.myns", "kafka-0.localhost.myns.svc",
        "kafka-0.localhost.myns.svc.cluster.local",
    }  # fmt: skip
    assert "kafka-0.kafka" in zones.names_of("kafka-0.kafka.myns.svc").forms


def test_no_domain_is_a_public_suffix_even_inside_a_zone() -> None:
    """`s3.amazonaws.com` is a public suffix inside the user's zone `amazonaws.com`: a
    broker under it is found under its own name, and the root helper refuses it as a
    domain."""
    zones = ClusterZones.of([], ["amazonaws.com"])
    assert zones.names_of("b-1.s3.amazonaws.com").suffixes == {"b-1.s3.amazonaws.com"}
    assert zones.refusal(["b-1.s3.amazonaws.com"], ["s3.amazonaws.com"]) is not None
    assert zones.refusal(["b-1.s3.amazonaws.com"], ["b-1.s3.amazonaws.com"]) is None


@pytest.mark.parametrize("namespaces", [["shop"], ["x", "com", "shop"], []])
def test_no_public_name_or_domain_comes_from_a_brokers_name(namespaces: list[str]) -> None:
    """Even when the user names the namespaces the hostile names use, no form and no
    routing domain is held by a public suffix, and the root helper refuses them too."""
    zones = ClusterZones.of(
        ["kafka-0.kafka-headless.shop.svc.cluster.local"], [], namespaces=namespaces
    )
    for advertised in PUBLIC_LOOKALIKES:
        assert zones.covers(advertised)
        names = zones.names_of(advertised)
        assert advertised in names.forms  # the name itself still resolves
        assert not (names.forms | names.suffixes) & PUBLIC, advertised
        for name in names.forms | names.suffixes:
            assert zones.covers(name) or public_suffix(name) is None, name
        for public in PUBLIC:
            assert zones.refusal([advertised, public], []) is not None
            assert zones.refusal([advertised], [public]) is not None


def test_short_forms_only_for_the_users_namespaces() -> None:
    """`kafka-0.wiki.corp.svc` in a namespace the user never named must not make the
    intranet name `wiki.corp` resolve here."""
    zones = ClusterZones.of(["kafka-0.kafka.staging.svc.cluster.local"])
    assert zones.namespaces == {"staging"}
    foreign = zones.names_of("kafka-0.wiki.corp.svc")
    assert foreign.forms == {"kafka-0.wiki.corp.svc", "kafka-0.wiki.corp.svc.cluster.local"}
    assert "wiki" not in foreign.suffixes and "wiki.corp" not in foreign.suffixes
    assert zones.refusal(["kafka-0.wiki.corp.svc", "kafka-0.wiki.corp"], []) is not None
    own = zones.names_of("kafka-1.kafka.staging.svc")
    assert {"kafka-1.kafka", "kafka-1.kafka.staging"} <= own.forms
    named = ClusterZones.of([], namespaces=["corp"]).names_of("kafka-0.kafka.corp.svc")
    assert {"kafka-0.kafka", "kafka-0.kafka.corp"} <= named.forms
    # `.wiki` is a TLD: `kafka-0.wiki` is a public name, even in the user's namespace
    assert (
        "kafka-0.wiki"
        not in ClusterZones.of([], namespaces=["corp"]).names_of("kafka-0.wiki.corp.svc").forms
    )


@pytest.mark.parametrize(
    ("name", "parts"),
    [
        ("kafka-0.kafka-headless.shop.svc.cluster.local",
         ("kafka-0", "kafka-headless", "shop", "cluster.local")),
        ("my-cluster-kafka-0.my-cluster-kafka-brokers.kafka.svc",
         ("my-cluster-kafka-0", "my-cluster-kafka-brokers", "kafka", "")),
        ("schema-registry.shop.svc.cluster.local",
         (None, "schema-registry", "shop", "cluster.local")),
        ("www.google.com.shop.svc.cluster.local", None),  # four labels before svc: no such name
        ("kafka.svc", None),
        ("broker.example.com", None),
    ],
)  # fmt: skip
def test_one_parser_of_kubernetes_names(name: str, parts: tuple[str | None, ...] | None) -> None:
    parsed = kubernetes_name(name)
    if parts is None:
        assert parsed is None
    else:
        assert parsed is not None
        assert (parsed.pod, parsed.service, parsed.namespace, parsed.domain) == parts


@pytest.mark.parametrize("zone", ["com", "co.uk", "github.io", "shop", "xn--p1ai"])
def test_a_public_suffix_is_never_a_zone(zone: str) -> None:
    with pytest.raises(UntrustedName, match="public suffix"):
        ClusterZones.of([], [zone])
    with pytest.raises(UntrustedName, match="public suffix"):
        ClusterZones.of([], cluster_domain=zone)
    assert zone not in ClusterZones.of([f"kafka.{zone}", f"b1.kafka.{zone}"]).zones
