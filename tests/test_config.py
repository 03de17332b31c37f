"""Settings precedence (default < kafkatunnel.toml profile < KAFKATUNNEL_* < flag), through
the real command line, and the errors that name the closest valid key, flag, variable or
profile."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from kafkatunnel.cli.profiles import ConfigError, Setting, load_profile

PROFILE = """
profile = "shop"

[profiles.shop]
via = "kubectl"
namespace = "from-file"
context = "from-file"
kubeconfig = "from-file"
connect_timeout = 3
broker-port = ["1=19093", "2=19094"]

[profiles.bastion]
via = "exec"
exec = "ssh bastion nc {host} {port}"
"""


def _run(
    cwd: Path, *args: str, env: dict[str, str] | None = None
) -> subprocess.CompletedProcess[str]:
    clean = {k: v for k, v in os.environ.items() if not k.startswith("KAFKATUNNEL_")}
    return subprocess.run(
        [sys.executable, "-m", "kafkatunnel", *args], cwd=cwd, env={**clean, **(env or {})},
        capture_output=True, text=True, timeout=60,
    )  # fmt: skip


def _settings(
    cwd: Path, *args: str, env: dict[str, str] | None = None
) -> dict[str, dict[str, object]]:
    out = _run(cwd, *args, env=env)
    assert out.returncode == 0, out.stdout + out.stderr
    return {row["setting"]: row for row in json.loads(out.stdout)["settings"]}


def test_flags_beat_the_environment_which_beats_the_profile(tmp_path: Path) -> None:
    (tmp_path / "kafkatunnel.toml").write_text(PROFILE)
    env = {"KAFKATUNNEL_CONTEXT": "from-env", "KAFKATUNNEL_KUBECONFIG": "from-env"}
    rows = _settings(tmp_path, "config", "show", "--json", "--", "--kubeconfig", "from-flag",
                     env=env)  # fmt: skip
    assert (rows["namespace"]["value"], rows["namespace"]["source"]) == ("from-file", "profile")
    assert (rows["context"]["value"], rows["context"]["source"]) == ("from-env", "environment")
    assert rows["context"]["from"] == "KAFKATUNNEL_CONTEXT"
    assert (rows["kubeconfig"]["value"], rows["kubeconfig"]["source"]) == ("from-flag", "flag")
    assert (rows["mode"]["value"], rows["mode"]["source"]) == ("rewrite", "default")
    assert rows["connect-timeout"]["value"] == 3.0
    assert rows["broker-port"]["value"] == ["1=19093", "2=19094"]
    assert rows["namespace"]["from"] == "kafkatunnel.toml [profiles.shop]"


def test_another_profile_by_flag_or_variable_and_another_file(tmp_path: Path) -> None:
    (tmp_path / "kafkatunnel.toml").write_text(PROFILE)
    by_flag = _settings(tmp_path, "--profile", "bastion", "config", "show", "--json")
    assert by_flag["exec"]["value"] == "ssh bastion nc {host} {port}"
    assert by_flag["namespace"]["source"] == "default"
    by_env = _settings(tmp_path, "config", "show", "--json",
                       env={"KAFKATUNNEL_PROFILE": "bastion"})  # fmt: skip
    assert by_env["via"]["value"] == "exec"
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    moved = _settings(elsewhere, "--config", str(tmp_path / "kafkatunnel.toml"), "config",
                      "show", "--json")  # fmt: skip
    assert moved["namespace"]["value"] == "from-file"
    assert _settings(elsewhere, "config", "show", "--json")["namespace"]["value"] is None


def test_up_takes_its_settings_from_the_profile(tmp_path: Path) -> None:
    (tmp_path / "kafkatunnel.toml").write_text(
        '[profiles.p]\nbootstrap = "kafka-0.kafka:9092"\nvia = "direct"\nmap = ["nonsense"]\n'
    )
    out = _run(tmp_path, "--profile", "p", "up")
    assert out.returncode == 2
    assert "nonsense" in out.stderr and "--map" in out.stderr  # the profile's map was used


def test_the_login_settings_come_from_a_profile(tmp_path: Path) -> None:
    """sasl-mechanism, sasl-username and sasl-password-file as profile keys: up reads them
    (its error names the profile's file), and `config show` lists them, not a password."""
    (tmp_path / "kafkatunnel.toml").write_text(
        '[profiles.p]\nbootstrap = "kafka-0.kafka:9092"\nexec = "nc {host} {port}"\n'
        'sasl-mechanism = "SCRAM-SHA-512"\nsasl-username = "alice"\n'
        'sasl-password-file = "no-such-file"\n'
    )
    out = _run(tmp_path, "--profile", "p", "up", "--no-table")
    assert out.returncode == 2 and "Traceback" not in out.stderr, out.stderr
    said = " ".join(out.stderr.split())
    assert "--sasl-password-file: cannot read no-such-file" in said, said
    rows = _settings(tmp_path, "--profile", "p", "config", "show", "--json")
    assert {k: rows[k]["value"] for k in ("sasl-mechanism", "sasl-username",
                                          "sasl-password-file", "sasl-password-env")} == {
        "sasl-mechanism": "SCRAM-SHA-512", "sasl-username": "alice",
        "sasl-password-file": "no-such-file", "sasl-password-env": None}  # fmt: skip


@pytest.mark.parametrize(
    ("toml", "args", "env", "message"),
    [
        ('[profiles.p]\nnamspace = "x"\n', ["--profile", "p"], {},
         "unknown setting 'namspace' (did you mean 'namespace'?)"),
        ('[profiles.p]\nvia = "exec"\n', ["--profile", "shp"], {},
         "no profile 'shp'"),
        ('[profiles.shop]\nvia = "exec"\n', ["--profile", "shp"], {},
         "(did you mean 'shop'?)"),
        ('profil = "p"\n', [], {}, "unknown top-level key 'profil' (did you mean 'profile'?)"),
        ('[profiles.p]\nconnect-timeout = "soon"\n', ["--profile", "p"], {},
         "connect-timeout must be float, not 'soon'"),
        ("[profiles.p\n", ["--profile", "p"], {}, "not valid TOML"),
        ("", [], {"KAFKATUNNEL_NAMESPAC": "x"},
         "KAFKATUNNEL_NAMESPAC is not a kafkatunnel setting (did you mean "
         "'KAFKATUNNEL_NAMESPACE'?)"),
    ],
    ids=["key", "profile", "profile-close", "top-level", "type", "toml", "variable"],
)  # fmt: skip
def test_mistakes_name_the_closest_valid_one(
    tmp_path: Path, toml: str, args: list[str], env: dict[str, str], message: str
) -> None:
    (tmp_path / "kafkatunnel.toml").write_text(toml)
    out = _run(tmp_path, *args, "config", "show", env=env)
    assert out.returncode == 2
    assert message in " ".join(out.stderr.split()), out.stderr


def test_a_mistyped_flag_names_the_closest_flag(tmp_path: Path) -> None:
    out = _run(tmp_path, "up", "--namspace", "shop")
    assert out.returncode == 2
    assert "No such option: --namspace" in out.stderr and "--namespace" in out.stderr


SETTINGS = {"namespace": Setting("namespace", "namespace", str),
            "map": Setting("map", "mapping", str, multiple=True),
            "dns": Setting("dns", "dns", bool)}  # fmt: skip


def test_values_are_checked_against_each_settings_type(tmp_path: Path) -> None:
    path = tmp_path / "k.toml"
    path.write_text('[profiles.p]\nmap = ["a=b"]\ndns = true\nnamespace = "n"\n')
    assert load_profile(SETTINGS, path, "p").values == {
        "mapping": ["a=b"], "dns": True, "namespace": "n"
    }  # fmt: skip
    path.write_text('[profiles.p]\nnamespace = ["a", "b"]\n')
    with pytest.raises(ConfigError, match="namespace takes one value, not a list"):
        load_profile(SETTINGS, path, "p")
    with pytest.raises(ConfigError, match="no configuration file at"):
        load_profile(SETTINGS, tmp_path / "missing.toml")


@pytest.mark.skipif(os.geteuid() != 0, reason="needs root to own files as another user")
def test_root_ignores_a_settings_file_of_another_user(tmp_path: Path) -> None:
    """As root in a directory that `nobody` owns, nobody's kafkatunnel.toml (its exec
    command included) is ignored with a warning; under sudo by nobody it is theirs."""
    import pwd

    nobody = pwd.getpwnam("nobody")
    marker = tmp_path / "ran"
    directory = tmp_path / "theirs"
    directory.mkdir()
    (directory / "kafkatunnel.toml").write_text(
        'profile = "p"\n[profiles.p]\nvia = "exec"\n'
        f'exec = "touch {marker} {{port}}"\nbootstrap = "127.0.0.1:1"\nstart-timeout = 2.0\n'
    )
    for path in (directory, directory / "kafkatunnel.toml"):
        os.chown(path, nobody.pw_uid, nobody.pw_gid)
    env = {k: v for k, v in os.environ.items() if not k.startswith(("KAFKATUNNEL_", "SUDO_"))}
    result = subprocess.run(
        [sys.executable, "-m", "kafkatunnel", "up", "--no-table"],
        cwd=directory, capture_output=True, text=True, timeout=60,
        env={**env, "KAFKATUNNEL_STATE_DIR": str(tmp_path / "state"), "PATH": "/usr/bin:/bin"},
    )  # fmt: skip
    assert not marker.exists(), "nobody's exec command ran as root"
    assert "warning: ignoring" in result.stderr and "belongs to uid" in result.stderr
    assert result.returncode == 2, result.stderr
    sudo = subprocess.run(
        [sys.executable, "-m", "kafkatunnel", "config", "show"],
        cwd=directory, capture_output=True, text=True, timeout=60,
        env={**env, "SUDO_UID": str(nobody.pw_uid)},
    )  # fmt: skip
    assert "profile: p" in sudo.stdout and "warning" not in sudo.stderr, sudo.stderr
