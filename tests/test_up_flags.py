"""`up` checks its flags in one place each, and a wrong value names its own flag: the
flags on their own (up_options.check), the tunnel's settings (TunnelConfig), and the
command line that reports either."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import typer

from kafkatunnel.cli.up_options import (
    DnsOptions,
    Guard,
    Limits,
    Reach,
    RecordFlags,
    Running,
    SaslFlags,
    Serving,
    TlsFlags,
    UpOptions,
    check,
    check_isolation,
)
from kafkatunnel.protocol import Isolation, Policy
from kafkatunnel.tunnel import SettingError, TunnelConfig
from kafkatunnel.tunnel.tls import TlsOptions, client_context

pytestmark = pytest.mark.quick

EXEC = "socat STDIO TCP:{host}:{port}"
REACH = Reach(bootstrap="kafka-0.kafka:9092", exec_template=EXEC)
DNS = ("127.0.0.1", 53)


@pytest.mark.parametrize(
    ("options", "flag"),
    [
        (UpOptions(REACH, serving=Serving(listen="127.0.0.1:99999")), "--listen"),
        (UpOptions(REACH, serving=Serving(metrics_listen="x")), "--metrics-listen"),
        (UpOptions(REACH, serving=Serving(broker_ports=("one",))), "--broker-port"),
        (UpOptions(REACH, serving=Serving(container_network="shop")), "--container-network"),
        (UpOptions(REACH, serving=Serving(services=("registry",))), "--service"),
        (UpOptions(REACH, dns=DnsOptions(True, listen="nowhere")), "--dns-listen"),
        (UpOptions(REACH, dns=DnsOptions(setup="dnsmasq")), "--dns-setup"),
        (UpOptions(REACH, tls=TlsFlags(ca=Path("ca.pem"))), "--tls"),
        (
            UpOptions(REACH, tls=TlsFlags(True, pkcs12=Path("me.p12"), key=Path("k"))),
            "--tls-pkcs12",
        ),
        (UpOptions(REACH, tls=TlsFlags(kafka_user="alice")), "--kafka-user"),
        (UpOptions(REACH, sasl=SaslFlags("GSSAPI", "a", password_env="P")), "--sasl-mechanism"),
        (UpOptions(REACH, sasl=SaslFlags(username="alice")), "--sasl-username"),
        (UpOptions(REACH, sasl=SaslFlags(password_env="P")), "--sasl-password-env"),
        (UpOptions(REACH, sasl=SaslFlags("PLAIN", password_env="P")), "--sasl-mechanism"),
        (UpOptions(REACH, sasl=SaslFlags("PLAIN", "alice")), "--sasl-mechanism"),
        (
            UpOptions(REACH, sasl=SaslFlags("PLAIN", "a", Path("p"), "P")),
            "--sasl-mechanism",
        ),
        (
            UpOptions(
                Reach(via="kubectl"),
                tls=TlsFlags(kafka_user="alice"),
                sasl=SaslFlags("PLAIN", "a", password_env="P"),
            ),
            "--sasl-mechanism",
        ),
        (
            UpOptions(
                REACH,
                sasl=SaslFlags("PLAIN", "a", password_env="P"),
                running=Running(mode="transparent"),
            ),
            "--sasl-mechanism",
        ),
        (
            UpOptions(
                Reach(via="kubectl"),
                tls=TlsFlags(kafka_user="alice"),
                running=Running(mode="transparent"),
            ),
            "--kafka-user",
        ),
        (UpOptions(REACH, record=RecordFlags(rotate="big")), "--record-rotate"),
        (UpOptions(REACH, record=RecordFlags(payloads=True)), "--record-payloads"),
        (UpOptions(REACH, running=Running(loop="trio")), "--loop"),
        (UpOptions(Reach(bootstrap="k:9092", exec_template="nc {host}")), "--exec"),
        (UpOptions(Reach(bootstrap="k:9092", via="direct", mappings=("a=b",))), "--map"),
        (UpOptions(Reach(via="exec", exec_template=EXEC)), "--bootstrap"),
        (UpOptions(REACH, guard=Guard(deny_api=("DeleteTopic",))), "--deny-api"),
        (UpOptions(REACH, guard=Guard(allow_api=("Produce",))), "--allow-api"),
        (UpOptions(REACH, guard=Guard(True, allow_api=("Produc",))), "--allow-api"),
        (UpOptions(REACH, guard=Guard(isolate_suffix="kt-me")), "--isolate-suffix"),
        (UpOptions(REACH, guard=Guard(isolate_from_deployed=True)), "--isolate-from-deployed"),
        (UpOptions(REACH, guard=Guard(isolate=True, isolate_suffix=".me")), "--isolate-suffix"),
        (UpOptions(REACH, guard=Guard(isolate=True, isolate_suffix="a/b")), "--isolate-suffix"),
        (UpOptions(REACH, guard=Guard(isolate=True, isolate_suffix="x" * 65)), "--isolate-suffix"),
    ],
)
def test_a_wrong_flag_is_named_by_the_check_of_the_flags(options: UpOptions, flag: str) -> None:
    with pytest.raises(typer.BadParameter) as refused:
        check(options)
    assert refused.value.param_hint == flag


def test_the_flags_the_check_passes_come_out_parsed() -> None:
    options = UpOptions(
        REACH,
        serving=Serving(listen="127.0.0.1:19092", broker_ports=("1=19093",)),
        dns=DnsOptions(True, listen="127.0.0.1:5353"),
        record=RecordFlags(Path("recordings"), rotate="1MiB"),
        limits=Limits(max_brokers=3),
    )
    checked = check(options)
    assert (checked.via, checked.listen, checked.dns_listen) == (
        "exec", ("127.0.0.1", 19092), ("127.0.0.1", 5353))  # fmt: skip
    assert (checked.broker_ports, checked.rotate_bytes) == ({1: 19093}, 1 << 20)


@pytest.mark.parametrize(
    ("settings", "flag"),
    [
        ({"max_brokers": 0}, "--max-brokers"),
        ({"max_connections": 0}, "--max-connections"),
        ({"connect_timeout": 0}, "--connect-timeout"),
        ({"start_timeout": -1}, "--start-timeout"),
        ({"mode": "tls"}, "--mode"),
        ({"mode": "transparent"}, "--dns"),
        (
            {
                "mode": "transparent",
                "dns_listen": ("127.0.0.1", 53),
                "tls": client_context(TlsOptions()),
            },
            "--tls",
        ),
        ({"brokers": ["kafka-1"]}, "--broker"),
        ({"bootstrap": "kafka-0 .kafka:9092"}, "--bootstrap"),
        ({"advertise": "a b"}, "--advertise"),
        ({"first_dns_address": "x"}, "--dns-first-address"),
        ({"dns_zones": ["com"]}, "--dns-zone"),
        ({"dns_zones": ["local"]}, "--dns-zone"),
        ({"bootstrap": "kafka.shop.svc.com:9092"}, "--bootstrap"),  # `com`: no cluster domain
        ({"brokers": ["kafka-1.kafka.shop.svc.co.uk:9092"]}, "--broker"),
        (
            {"mode": "transparent", "dns_listen": ("127.0.0.1", 53), "policy": Policy.of(True)},
            "--read-only",
        ),
        (
            {
                "mode": "transparent",
                "dns_listen": ("127.0.0.1", 53),
                "policy": Policy.of(isolated=True),
                "isolation": Isolation("kt-me"),
            },
            "--isolate",
        ),
    ],
)
def test_a_setting_the_tunnel_cannot_run_with_names_its_flag(
    settings: dict[str, object], flag: str
) -> None:
    with pytest.raises(SettingError) as refused:
        TunnelConfig(**{"bootstrap": "kafka-0.kafka:9092", **settings})  # type: ignore[arg-type]
    assert refused.value.flag == flag


@pytest.mark.parametrize(
    ("argv", "said"),
    [  # one flag checked with the others, two checked by the tunnel's settings
        (["--record-payloads"], "Invalid value for --record-payloads: goes with --record DIR"),
        (["--max-brokers", "0"], "Invalid value for --max-brokers: must be from 1 to 65535"),
        (
            ["--isolate", "--isolate-suffix", "kt/me"],
            "Invalid value for --isolate-suffix: 'kt/me': use 1 to 64 of Kafka's name "
            "characters (letters, digits, '.', '_', '-'), not starting with '.'",
        ),
        (["--mode", "transparent"], "Invalid value for --dns: transparent mode needs the DNS"),
        (
            ["--deny-api", "DeleteTopic"],
            "Invalid value for --deny-api: 'DeleteTopic' is not a "
            "Kafka API name; the names are: AddOffsetsToTxn, AddPartitionsToTxn",
        ),
    ],
)
def test_up_reports_a_wrong_value_under_its_own_flag(
    argv: list[str], said: str, tmp_path: Path
) -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith("KAFKATUNNEL_")}
    result = subprocess.run(
        [sys.executable, "-m", "kafkatunnel", "up", "--exec", EXEC, "--bootstrap",
         "kafka-0.kafka:9092", *argv],
        capture_output=True, text=True, timeout=60, cwd=tmp_path,
        env={**env, "KAFKATUNNEL_STATE_DIR": str(tmp_path), "COLUMNS": "200"},
    )  # fmt: skip
    assert result.returncode == 2, result.stderr
    assert said in " ".join(result.stderr.split()), result.stderr
    assert "Traceback" not in result.stderr


def test_the_isolation_suffix_defaults_to_the_user_name_in_kafkas_characters() -> None:
    """kt-USER, the user's name with what Kafka's names cannot hold made '-', bounded."""
    isolate = Guard(isolate=True)
    assert check_isolation(isolate, "anna") == Isolation("kt-anna")
    assert check_isolation(isolate, "DOMAIN\\anna.m") == Isolation("kt-DOMAIN-anna-m")
    assert check_isolation(isolate, "\u00e9l\u00e8ve") == Isolation("kt-l-ve")
    assert check_isolation(isolate, "x" * 200) == Isolation("kt-" + "x" * 60)
    assert check_isolation(isolate, "///") == Isolation("kt-local")
    assert check_isolation(Guard(isolate=True, isolate_suffix="laptop.1"), "anna") == (
        Isolation("laptop.1"))  # fmt: skip
    assert check_isolation(Guard(), "anna") is None
    from_deployed = check_isolation(Guard(isolate=True, isolate_from_deployed=True), "anna")
    assert from_deployed == Isolation("kt-anna", from_deployed=True)
