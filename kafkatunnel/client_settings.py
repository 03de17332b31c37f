"""What a Kafka client needs to use a running tunnel, named as each ecosystem reads it, and
written in each format a shell, an IDE or a client reads (`kafkatunnel env`, and the
environment of `kafkatunnel run`'s command).

One table: each Kafka setting has one row with its name for Kafka's Java clients and
tools (client.properties), for librdkafka (kcat -F) and the environment variables that set
it in applications: KAFKA_* as Quarkus reads it (and most images and apps by convention),
SPRING_KAFKA_* as Spring Boot's relaxed binding reads it. No format keeps its own copy.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

# Where the files with the same settings are (a path in a variable): Kafka's Java tools
# (`--command-config "$KAFKA_CLIENT_PROPERTIES"`) and kcat, which reads KCAT_CONFIG itself.
JAVA_FILE_VARIABLE = "KAFKA_CLIENT_PROPERTIES"
LIBRDKAFKA_FILE_VARIABLE = "KCAT_CONFIG"


def _same(value: str) -> str:
    return value


def _spring_resource(path: str) -> str:
    return f"file:{path}"  # Spring Boot reads a location as a resource


@dataclass(frozen=True)
class Variable:
    name: str
    value: Callable[[str], str] = _same


@dataclass(frozen=True)
class ClientSetting:
    """One setting, by each name it goes by (None: that ecosystem has no such setting)."""

    java: str
    librdkafka: str | None
    variables: tuple[Variable, ...]


BOOTSTRAP = ClientSetting(
    "bootstrap.servers",
    "bootstrap.servers",
    (Variable("KAFKA_BOOTSTRAP_SERVERS"), Variable("SPRING_KAFKA_BOOTSTRAP_SERVERS")),
)
SECURITY_PROTOCOL = ClientSetting(
    "security.protocol",
    "security.protocol",
    (Variable("KAFKA_SECURITY_PROTOCOL"), Variable("SPRING_KAFKA_SECURITY_PROTOCOL")),
)
TRUSTED_CA_TYPE = ClientSetting(  # Java reads a PEM trust store since Kafka 2.7 (KIP-651)
    "ssl.truststore.type",
    None,
    (Variable("KAFKA_SSL_TRUSTSTORE_TYPE"), Variable("SPRING_KAFKA_SSL_TRUSTSTORETYPE")),
)
TRUSTED_CA = ClientSetting(
    "ssl.truststore.location",
    "ssl.ca.location",
    (
        Variable("KAFKA_SSL_TRUSTSTORE_LOCATION"),
        Variable("SPRING_KAFKA_SSL_TRUSTSTORELOCATION", _spring_resource),
    ),
)
SASL_MECHANISM = ClientSetting(  # librdkafka reads sasl.mechanism as sasl.mechanisms
    "sasl.mechanism",
    "sasl.mechanism",
    (Variable("KAFKA_SASL_MECHANISM"), Variable("SPRING_KAFKA_PROPERTIES_SASL_MECHANISM")),
)
TABLE = (BOOTSTRAP, SECURITY_PROTOCOL, TRUSTED_CA_TYPE, TRUSTED_CA, SASL_MECHANISM)
FORMATS = ("sh", "fish", "powershell", "dotenv", "json", "properties", "librdkafka")


class SettingsError(ValueError):
    """A value no format could carry as it is (a newline in a path, say)."""


def client_settings(status: Mapping[str, Any]) -> dict[ClientSetting, str]:
    """The settings a client of the tunnel whose `status` this is needs: where it listens;
    when it serves clients TLS (--client-tls), the CA to trust; when the cluster wants a
    login the tunnel does not make for its clients, the security.protocol that carries
    the client's own and its mechanism, when the listener enables one (never the user or
    a secret: those are the client's). Otherwise the tunnel logs in for its clients."""
    settings = {BOOTSTRAP: str(status["bootstrap_servers"])}
    client_tls = status.get("client_tls")
    if client_tls:
        settings |= {SECURITY_PROTOCOL: "SSL", TRUSTED_CA_TYPE: "PEM",
                     TRUSTED_CA: str(client_tls["ca"])}  # fmt: skip
    login = status.get("client_login")
    if login:
        settings[SECURITY_PROTOCOL] = str(login["security_protocol"])
        if len(login["mechanisms"]) == 1:  # of several, the client's credentials choose
            settings[SASL_MECHANISM] = str(login["mechanisms"][0])
    for value in settings.values():
        if not value or any(c in value for c in "\r\n\0"):
            raise SettingsError(f"{value!r} cannot be a client setting")
    return settings


def java_properties(settings: Mapping[ClientSetting, str]) -> dict[str, str]:
    return {setting.java: value for setting, value in settings.items()}


def librdkafka_properties(settings: Mapping[ClientSetting, str]) -> dict[str, str]:
    return {s.librdkafka: value for s, value in settings.items() if s.librdkafka is not None}


def environment(
    settings: Mapping[ClientSetting, str], files: Mapping[str, Path] | None = None
) -> dict[str, str]:
    """Every variable of every row, and the paths of the files written with the same
    settings (`files`: JAVA_FILE_VARIABLE, LIBRDKAFKA_FILE_VARIABLE -> path), if any."""
    out = {v.name: v.value(value) for s, value in settings.items() for v in s.variables}
    return out | {name: str(path) for name, path in (files or {}).items()}


def render(fmt: str, settings: Mapping[ClientSetting, str], files: Mapping[str, Path]) -> str:
    """The settings in format `fmt` (one of FORMATS): the environment for a shell, an
    IDE's .env or a JSON reader; the client's own properties for the last two."""
    if fmt == "properties":
        return _lines(f"{_java_escape(k, key=True)}={_java_escape(v)}"
                      for k, v in java_properties(settings).items())  # fmt: skip
    if fmt == "librdkafka":  # key=value, no escapes: values were checked for newlines
        return _lines(f"{k}={v}" for k, v in librdkafka_properties(settings).items())
    variables = environment(settings, files)
    if fmt == "json":
        return json.dumps(variables, indent=2) + "\n"
    line = {
        "sh": lambda k, v: f"export {k}={_posix_quote(v)}",
        "fish": lambda k, v: f"set -gx {k} {_fish_quote(v)}",
        "powershell": lambda k, v: f"$env:{k} = '{v.replace(chr(39), chr(39) * 2)}'",
        "dotenv": lambda k, v: f"{k}='{_dotenv_escape(v)}'",
    }.get(fmt)
    if line is None:
        raise SettingsError(f"{fmt!r} is not a format: {', '.join(FORMATS)}")
    return _lines(line(k, v) for k, v in variables.items())


def _lines(lines: Any) -> str:
    return "".join(f"{line}\n" for line in lines)


def _posix_quote(value: str) -> str:
    return "'" + value.replace("'", "'\\''") + "'"


def _fish_quote(value: str) -> str:
    return "'" + value.replace("\\", "\\\\").replace("'", "\\'") + "'"


def _dotenv_escape(value: str) -> str:
    """Single-quoted, as python-dotenv reads it: no ${...} expansion, only \\ and \\'
    escaped (a value without either reads the same in every .env reader)."""
    return value.replace("\\", "\\\\").replace("'", "\\'")


_JAVA_KEY_SPECIAL = re.compile(r"[\\=:#! \t\f]|[^\x20-\x7e]")
_JAVA_VALUE_SPECIAL = re.compile(r"[\\\t\f]|[^\x20-\x7e]")


def _java_escape(text: str, *, key: bool = False) -> str:
    """As java.util.Properties.load reads it (ISO-8859-1, as Kafka's tools load a file):
    backslash escapes, \\uXXXX beyond ASCII; in a key also what would end it (= : and
    spaces) or start a comment; in a value, a leading space. A value keeps its = and :
    as they are (Properties.store would escape them too: a reader sees them plain)."""

    def escaped(match: re.Match[str]) -> str:
        char = match.group()
        if char in "\\=:#! ":
            return "\\" + char
        if char == "\t":
            return "\\t"
        if char == "\f":
            return "\\f"
        return "".join(f"\\u{unit:04x}" for unit in _utf16_units(char))

    out = (_JAVA_KEY_SPECIAL if key else _JAVA_VALUE_SPECIAL).sub(escaped, text)
    return "\\ " + out[1:] if not key and out.startswith(" ") else out


def _utf16_units(char: str) -> list[int]:
    data = char.encode("utf-16-be")
    return [int.from_bytes(data[i : i + 2], "big") for i in range(0, len(data), 2)]
