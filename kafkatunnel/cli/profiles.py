"""Settings from `kafkatunnel.toml` profiles and `KAFKATUNNEL_*` environment variables.

Precedence, lowest first: the built-in default, the profile in kafkatunnel.toml (in the
working directory, or --config FILE), the environment variable, the flag. A setting is
named as its flag is, without the dashes (`connect-timeout`; `connect_timeout` works too);
its variable is KAFKATUNNEL_ and the name in capitals (KAFKATUNNEL_CONNECT_TIMEOUT).

    profile = "shop"            # the profile used without --profile

    [profiles.shop]
    via = "kubectl"
    namespace = "shop"
    context = "prod-eu"
    record = "recordings/"

    [profiles.bastion]
    bootstrap = "kafka-0.kafka-headless.shop.svc.cluster.local:9092"
    via = "exec"
    exec = "ssh bastion nc {host} {port}"
    broker-port = ["1=19093", "2=19094"]

A misspelt key, profile or variable is an error that names the closest valid one.

A kafkatunnel.toml found in the working directory is obeyed only when it and the directory
belong to the user running the command (or, under sudo, to the user who ran sudo): it can
name commands to run (`exec`), and a directory of someone else's is theirs to fill. git
refuses such repositories for the same reason (CVE-2022-24765). --config FILE is always
read: naming a file is trusting it.
"""

from __future__ import annotations

import difflib
import os
import tomllib
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

CONFIG_FILE = "kafkatunnel.toml"
ENV_PREFIX = "KAFKATUNNEL_"
# Variables read elsewhere, not settings of a command.
OTHER_VARIABLES = {
    "KAFKATUNNEL_CONFIG": "the configuration file (--config)",
    "KAFKATUNNEL_PROFILE": "the profile (--profile)",
    "KAFKATUNNEL_STATE_DIR": "where running tunnels leave their state files",
    "KAFKATUNNEL_CLIENT_CONFIG": "extra client settings for the workload helper",
    "KAFKATUNNEL_TLS_PASSWORD": "the password of an encrypted --tls-key",
    "KAFKATUNNEL_KAFKA_LIB": "where Apache Kafka's jars are, for `demo --cluster apache`",
}
TOP_LEVEL = ("profile", "profiles")


class ConfigError(ValueError):
    """A configuration mistake; the message names the fix."""


@dataclass(frozen=True)
class Setting:
    """One configurable option of a command, as the file and the environment name it."""

    key: str  # the flag without dashes: connect-timeout
    name: str  # the parameter name in the command: connect_timeout
    kind: type  # bool, int, float or str
    multiple: bool = False

    @property
    def variable(self) -> str:
        return ENV_PREFIX + self.key.upper().replace("-", "_")


@dataclass
class Profile:
    name: str | None
    source: str  # e.g. "kafkatunnel.toml [profiles.shop]"
    values: dict[str, Any] = field(default_factory=dict)  # parameter name -> value


def closest(word: str, choices: Iterable[str]) -> str:
    """' (did you mean X?)', or '' when nothing is close."""
    found = difflib.get_close_matches(word, list(choices), n=1, cutoff=0.6)
    return f" (did you mean {found[0]!r}?)" if found else ""


def _convert(setting: Setting, value: Any, where: str) -> Any:
    values = value if setting.multiple and isinstance(value, list) else [value]
    if isinstance(value, list) and not setting.multiple:
        raise ConfigError(f"{where}: {setting.key} takes one value, not a list")
    out = []
    for item in values:
        ok = isinstance(item, setting.kind) and not (setting.kind is int and isinstance(item, bool))
        if setting.kind is float and isinstance(item, int) and not isinstance(item, bool):
            item, ok = float(item), True
        if not ok:
            raise ConfigError(
                f"{where}: {setting.key} must be {setting.kind.__name__}, not {item!r}"
            )
        out.append(item)
    return out if setting.multiple else out[0]


def trusted_owners() -> set[int]:
    """Who may own a settings file we find by ourselves: the user, and under sudo the user
    who ran it (as git's safe.directory check does)."""
    owners = {os.geteuid()}
    sudo_uid = os.environ.get("SUDO_UID", "")
    if os.geteuid() == 0 and sudo_uid.isdigit():
        owners.add(int(sudo_uid))
    return owners


def foreign_owner(file: Path) -> str | None:
    """Why `file` (found in the working directory) is not the user's to obey, or None."""
    owners = trusted_owners()
    for path in (file, file.parent):
        uid = path.stat().st_uid
        if uid not in owners:
            return f"{path} belongs to uid {uid}, not to you"
    return None


def load_profile(
    settings: Mapping[str, Setting],
    path: Path | None = None,
    profile: str | None = None,
    warn: Callable[[str], None] | None = None,
) -> Profile:
    """The chosen profile's settings, checked. No file and no profile asked: no settings.
    A file found (not named) that someone else owns is ignored, saying so through `warn`."""
    file = path or Path.cwd() / CONFIG_FILE
    if path is None and file.exists():
        foreign = foreign_owner(file)
        if foreign is not None:
            if warn is not None:
                warn(f"ignoring {file}: {foreign} (name it with --config FILE to use it)")
            file = Path("/nonexistent") / CONFIG_FILE
    if not file.exists():
        if path is not None:
            raise ConfigError(f"no configuration file at {path} (--config)")
        if profile is not None:
            raise ConfigError(f"profile {profile!r} asked for, but there is no {CONFIG_FILE} here")
        return Profile(None, "default")
    try:
        data = tomllib.loads(file.read_text())
    except tomllib.TOMLDecodeError as error:
        raise ConfigError(f"{file}: not valid TOML: {error}") from None
    for key in data:
        if key not in TOP_LEVEL:
            raise ConfigError(
                f"{file}: unknown top-level key {key!r}{closest(key, TOP_LEVEL)}; settings go "
                "in a [profiles.NAME] table"
            )
    profiles = data.get("profiles", {})
    if not isinstance(profiles, dict):
        raise ConfigError(f"{file}: profiles must be tables: [profiles.NAME]")
    name = profile or data.get("profile")
    if name is None:
        return Profile(None, "default")
    if name not in profiles:
        known = ", ".join(sorted(profiles)) or "none"
        raise ConfigError(
            f"{file}: no profile {name!r}{closest(str(name), profiles)}; profiles: {known}"
        )
    table = profiles[name]
    where = f"{file.name} [profiles.{name}]"
    by_key = {s.key: s for s in settings.values()}
    values: dict[str, Any] = {}
    for raw_key, value in table.items():
        key = raw_key.replace("_", "-")
        setting = by_key.get(key)
        if setting is None:
            raise ConfigError(f"{where}: unknown setting {raw_key!r}{closest(key, by_key)}")
        values[setting.name] = _convert(setting, value, where)
    return Profile(str(name), where, values)


def check_environment(
    settings: Mapping[str, Setting], environ: Mapping[str, str] = os.environ
) -> None:
    """A KAFKATUNNEL_* variable that is no setting is a mistake: name the closest one."""
    known = {s.variable for s in settings.values()} | set(OTHER_VARIABLES)
    for variable in environ:
        if variable.startswith(ENV_PREFIX) and variable not in known:
            raise ConfigError(
                f"environment variable {variable} is not a kafkatunnel setting"
                f"{closest(variable, known)}"
            )
