"""The client settings of `kafkatunnel env` and `run`: one table, each format read back by
the program that reads it (bash, fish, python-dotenv as IDEs' loaders use it, json, Java's
java.util.Properties), values that need quoting among them."""

from __future__ import annotations

import io
import json
import os
import shutil
import subprocess
from pathlib import Path

import pytest
from dotenv import dotenv_values

from kafkatunnel.client_settings import (
    BOOTSTRAP,
    FORMATS,
    JAVA_FILE_VARIABLE,
    LIBRDKAFKA_FILE_VARIABLE,
    SASL_MECHANISM,
    TABLE,
    TRUSTED_CA,
    SettingsError,
    client_settings,
    environment,
    java_properties,
    librdkafka_properties,
    render,
)

# A CA path as a user's state directory may spell it: spaces, quotes, $, backslashes,
# the characters properties files escape, and beyond ASCII.
AWKWARD = '/home/o\'brien/My $HOME "x"/a\\b/c=d:e#f!g/é 🐟/ca.pem'
STATUS = {"bootstrap_servers": "127.0.0.1:9092", "client_tls": {"ca": AWKWARD}}
# clients served TLS who log in themselves: every row of the table set
WITH_LOGIN = STATUS | {"client_login": {"security_protocol": "SASL_SSL",
                                        "mechanisms": ["SCRAM-SHA-512"]}}  # fmt: skip
FILES = {JAVA_FILE_VARIABLE: Path("/run/k t/client.properties"),
         LIBRDKAFKA_FILE_VARIABLE: Path("/run/k t/librdkafka.conf")}  # fmt: skip


@pytest.mark.quick
def test_plain_tunnel_clients_need_only_where_it_listens() -> None:
    settings = client_settings({"bootstrap_servers": "127.0.0.1:9092", "client_tls": None})
    assert settings == {BOOTSTRAP: "127.0.0.1:9092"}
    assert environment(settings) == {
        "KAFKA_BOOTSTRAP_SERVERS": "127.0.0.1:9092",
        "SPRING_KAFKA_BOOTSTRAP_SERVERS": "127.0.0.1:9092",
    }
    assert (
        java_properties(settings)
        == librdkafka_properties(settings)
        == {"bootstrap.servers": "127.0.0.1:9092"}
    )


@pytest.mark.quick
def test_client_tls_adds_the_protocol_and_the_ca_in_each_ecosystems_names() -> None:
    settings = client_settings(STATUS)
    assert java_properties(settings) == {
        "bootstrap.servers": "127.0.0.1:9092", "security.protocol": "SSL",
        "ssl.truststore.type": "PEM", "ssl.truststore.location": AWKWARD}  # fmt: skip
    assert librdkafka_properties(settings) == {
        "bootstrap.servers": "127.0.0.1:9092", "security.protocol": "SSL",
        "ssl.ca.location": AWKWARD}  # fmt: skip
    variables = environment(settings, FILES)
    assert variables["KAFKA_SSL_TRUSTSTORE_LOCATION"] == AWKWARD
    assert variables["SPRING_KAFKA_SSL_TRUSTSTORELOCATION"] == f"file:{AWKWARD}"  # a resource
    assert variables["KAFKA_SECURITY_PROTOCOL"] == "SSL"
    assert variables[JAVA_FILE_VARIABLE] == "/run/k t/client.properties"
    # every variable of every row but the login's, and nothing else
    rows = {v.name for row in TABLE if row is not SASL_MECHANISM for v in row.variables}
    assert set(variables) == rows | set(FILES)


@pytest.mark.quick
def test_a_login_the_clients_make_themselves_adds_its_protocol_and_mechanism() -> None:
    """The cluster wants a login the tunnel does not make (no --sasl-mechanism, no
    --kafka-user): the client says how it logs in, never with whose secret."""
    login = {"security_protocol": "SASL_PLAINTEXT", "mechanisms": ["SCRAM-SHA-256"]}
    settings = client_settings({"bootstrap_servers": "127.0.0.1:9092", "client_login": login})
    assert java_properties(settings) == librdkafka_properties(settings) == {
        "bootstrap.servers": "127.0.0.1:9092", "security.protocol": "SASL_PLAINTEXT",
        "sasl.mechanism": "SCRAM-SHA-256"}  # fmt: skip
    assert environment(settings) == {
        "KAFKA_BOOTSTRAP_SERVERS": "127.0.0.1:9092",
        "SPRING_KAFKA_BOOTSTRAP_SERVERS": "127.0.0.1:9092",
        "KAFKA_SECURITY_PROTOCOL": "SASL_PLAINTEXT",
        "SPRING_KAFKA_SECURITY_PROTOCOL": "SASL_PLAINTEXT",
        "KAFKA_SASL_MECHANISM": "SCRAM-SHA-256",
        "SPRING_KAFKA_PROPERTIES_SASL_MECHANISM": "SCRAM-SHA-256",
    }


@pytest.mark.quick
def test_a_login_over_client_tls_is_sasl_ssl_with_the_ca() -> None:
    settings = java_properties(client_settings(WITH_LOGIN))
    assert settings["security.protocol"] == "SASL_SSL"
    assert settings["sasl.mechanism"] == "SCRAM-SHA-512"
    assert settings["ssl.truststore.location"] == AWKWARD
    variables = environment(client_settings(WITH_LOGIN), FILES)
    assert set(variables) == {v.name for row in TABLE for v in row.variables} | set(FILES)


@pytest.mark.quick
def test_of_several_mechanisms_the_client_chooses() -> None:
    login = {"security_protocol": "SASL_PLAINTEXT", "mechanisms": ["SCRAM-SHA-512", "PLAIN"]}
    settings = client_settings({"bootstrap_servers": "127.0.0.1:9092", "client_login": login})
    assert java_properties(settings) == {"bootstrap.servers": "127.0.0.1:9092",
                                         "security.protocol": "SASL_PLAINTEXT"}  # fmt: skip


@pytest.mark.quick
@pytest.mark.parametrize("value", ["", "a\nb", "a\rb", "a\0b"])
def test_a_value_no_format_can_carry_is_refused(value: str) -> None:
    with pytest.raises(SettingsError):
        client_settings({"bootstrap_servers": "127.0.0.1:9092", "client_tls": {"ca": value}})


@pytest.mark.quick
def test_an_unknown_format_is_refused_naming_the_formats() -> None:
    with pytest.raises(SettingsError, match="sh, fish"):
        render("yaml", client_settings(STATUS), FILES)


def _expected() -> dict[str, str]:
    return environment(client_settings(WITH_LOGIN), FILES)


def _shell_reads(shell: list[str], text: str, names: list[str]) -> dict[str, str]:
    printing = "".join(f'printf "%s\\0" "${name}"\n' for name in names)
    out = subprocess.run([*shell, text + printing], capture_output=True, timeout=30, check=True,
                         env={"PATH": os.environ["PATH"]}).stdout  # fmt: skip
    return dict(zip(names, out.decode().split("\0")[:-1], strict=True))


@pytest.mark.quick
def test_sh_is_read_back_by_bash_and_dash() -> None:
    text, names = render("sh", client_settings(WITH_LOGIN), FILES), list(_expected())
    for shell in (["bash", "-c"], ["sh", "-c"]):
        assert _shell_reads(shell, text, names) == _expected(), shell


@pytest.mark.quick
def test_fish_is_read_back_by_fish() -> None:
    assert shutil.which("fish"), "scripts/test installs Debian's fish"
    text, names = render("fish", client_settings(WITH_LOGIN), FILES), list(_expected())
    assert _shell_reads(["fish", "-c"], text, names) == _expected()


@pytest.mark.quick
def test_dotenv_is_read_back_by_python_dotenv() -> None:
    text = render("dotenv", client_settings(WITH_LOGIN), FILES)
    assert dotenv_values(stream=io.StringIO(text)) == _expected()


@pytest.mark.quick
def test_json_is_read_back() -> None:
    assert json.loads(render("json", client_settings(WITH_LOGIN), FILES)) == _expected()


@pytest.mark.quick
def test_powershell_quotes_single_quotes_by_doubling_them() -> None:
    """PowerShell is not in Debian: its rule, a single-quoted string where '' is one '
    and nothing else is special (about_Quoting_Rules), is checked as written."""
    text = render("powershell", client_settings(WITH_LOGIN), FILES)
    line = next(x for x in text.splitlines() if x.startswith("$env:KAFKA_SSL_TRUSTSTORE_LOCATION"))
    quoted = line.split(" = ", 1)[1]
    assert quoted.startswith("'") and quoted.endswith("'")
    assert quoted[1:-1].replace("''", "'") == AWKWARD
    assert "'" not in quoted[1:-1].replace("''", "")


@pytest.mark.quick
def test_librdkafka_lines_are_key_equals_value() -> None:
    """librdkafka's file reader (rdkafka_conf.c, as kcat -F uses it) takes each line as
    key=value up to its end, with no escapes: the value stays as it is."""
    text = render("librdkafka", client_settings(WITH_LOGIN), FILES)
    read = dict(line.split("=", 1) for line in text.splitlines())
    assert read == librdkafka_properties(client_settings(WITH_LOGIN))


def test_properties_are_read_back_by_javas_properties(tmp_path: Path) -> None:
    written = render("properties", client_settings(WITH_LOGIN), {})
    (tmp_path / "client.properties").write_text(written)
    reader = tmp_path / "Read.java"
    reader.write_text(
        "import java.io.*; import java.util.*;\n"
        "public class Read { public static void main(String[] a) throws Exception {\n"
        "  Properties p = new Properties();\n"
        '  try (Reader r = new InputStreamReader(new FileInputStream(a[0]), "ISO-8859-1")) '
        "{ p.load(r); }\n"
        '  PrintStream out = new PrintStream(System.out, true, "UTF-8");\n'
        '  for (String k : new TreeSet<>(p.stringPropertyNames())) out.print(k + "\\0" + '
        'p.getProperty(k) + "\\0"); } }\n'
    )
    out = subprocess.run(["java", str(reader), str(tmp_path / "client.properties")],
                         capture_output=True, timeout=120, check=True).stdout  # fmt: skip
    parts = out.decode().split("\0")[:-1]
    assert dict(zip(parts[::2], parts[1::2], strict=True)) == java_properties(
        client_settings(WITH_LOGIN)
    )


@pytest.mark.quick
def test_every_format_is_listed() -> None:
    settings = client_settings(WITH_LOGIN)
    for fmt in FORMATS:
        assert render(fmt, settings, FILES).endswith("\n")
    assert TRUSTED_CA.librdkafka == "ssl.ca.location"
