"""What runs as root under `sudo up --dns`, tested without root: the helper's check of each
request the child sends (tests/dns/test_sudo.py runs the same over the real channel, as
root), and the check that the user can read the installation before root is dropped."""

from __future__ import annotations

import json
import os
import pwd
import subprocess
import sys
import sysconfig
from pathlib import Path

import pytest

import kafkatunnel
from kafkatunnel.hostnames import ClusterZones, UntrustedName
from kafkatunnel.privileges import MAX_NAMES, MAX_REQUEST, SetupRequest, _serve, checked_setup

pytestmark = pytest.mark.quick

BROKER = "kafka-0.kafka-headless.demo.svc.cluster.local"
ZONES = ClusterZones.of([BROKER])
GOOD = {"method": "hosts", "names": {BROKER: "127.0.0.2"}, "domains": ["cluster.local"],
        "server": ["127.0.0.1", 53]}  # fmt: skip
MANY = {f"kafka-{i}.kafka-headless.demo.svc.cluster.local": "127.0.0.2" for i in range(MAX_NAMES)}


def _asked(**changes: object) -> dict[str, object]:
    return {**GOOD, **changes}


SERVER = r"server must be \[address, port\]"
REFUSED = [  # what the child asks, the reason the helper gives (a regular expression)
    pytest.param("a string", "a set-up needs exactly method, names, domains and server",
                 id="not a dict"),
    pytest.param(_asked(hosts_file="/etc/shadow"), "a set-up needs exactly method",
                 id="an extra key"),
    pytest.param({k: v for k, v in GOOD.items() if k != "server"}, "a set-up needs exactly",
                 id="no server"),
    pytest.param(_asked(method="../../../tmp/x"), r"method '\.\./\.\./\.\./tmp/x' is not one of",
                 id="method a path"),
    pytest.param(_asked(method=["hosts"]), r"""method "\['hosts'\]" is not one of auto""",
                 id="method a list"),
    pytest.param(_asked(names=[BROKER]), "names must map host names to addresses",
                 id="names a list"),
    pytest.param(_asked(names={BROKER: 2}), "names must map host names to addresses",
                 id="an address a number"),
    pytest.param(_asked(domains="cluster.local"), "domains must be a list of domain names",
                 id="domains a string"),
    pytest.param(_asked(domains=[["cluster.local"]]), "domains must be a list of domain names",
                 id="a domain a list"),
    pytest.param(_asked(names={**MANY, "kafka.demo.svc": "127.0.0.2"}),
                 f"more than {MAX_NAMES} names or domains", id="over MAX_NAMES names"),
    pytest.param(_asked(domains=["cluster.local"] * (MAX_NAMES + 1)),
                 f"more than {MAX_NAMES} names or domains", id="over MAX_NAMES domains"),
    pytest.param(_asked(names={BROKER: "6.6.6.6"}),
                 f"the address of '{BROKER}' must be a loopback address, not '6.6.6.6'",
                 id="a name to a public address"),
    pytest.param(_asked(names={BROKER: "localhost"}), "must be a loopback address, not 'local",
                 id="a name to a name"),
    pytest.param(_asked(server=["127.0.0.1", 53, 54]), SERVER, id="a 3-element server"),
    pytest.param(_asked(server=["127.0.0.1"]), SERVER, id="a 1-element server"),
    pytest.param(_asked(server="127.0.0.1:53"), SERVER, id="server a string"),
    pytest.param(_asked(server=["127.0.0.1", "53; reboot"]), SERVER, id="port a command"),
    pytest.param(_asked(server=["127.0.0.1", True]), SERVER, id="port a bool"),
    pytest.param(_asked(server=["127.0.0.1", 53.0]), SERVER, id="port a float"),
    pytest.param(_asked(server=["8.8.8.8", 53]),
                 "the DNS server must be a loopback address, not '8.8.8.8'",
                 id="a public DNS server"),
    pytest.param(_asked(server=["127.0.0.1\nnameserver 6.6.6.6", 53]),
                 "the DNS server must be a loopback address", id="a server with a second line"),
    pytest.param(_asked(server=["127.0.0.1", 0]), "port 0 is not between 1 and 65535",
                 id="port 0"),
    pytest.param(_asked(names={BROKER: "127.0.0.2", "github.com": "127.0.0.2"}),
                 "'github.com' is outside the cluster's zones", id="a public name"),
    pytest.param(_asked(names={"kafka-3.github.com.svc": "127.0.0.2",
                               "kafka-3.github.com": "127.0.0.2"}),
                 "'kafka-3.github.com' is outside the cluster's zones",
                 id="a public short form"),
    pytest.param(_asked(names={"evil\n6.6.6.6 evil.example.org": "127.0.0.2"}),
                 "is not a host name", id="a name with a newline"),
    pytest.param(_asked(domains=["com"]), "domain 'com' is outside the cluster's zones",
                 id="domain com"),
    pytest.param(_asked(domains=["kafka-headless"]), "domain 'kafka-headless' is outside the",
                 id="a short form's domain"),
    pytest.param(_asked(domains=["../../etc"]), r"'\.\./\.\./etc' is not a host name",
                 id="a domain a path"),
]  # fmt: skip


@pytest.mark.parametrize(("asked", "reason"), REFUSED)
def test_the_root_helper_refuses_each_request_the_tunnel_never_sends(
    asked: object, reason: str
) -> None:
    with pytest.raises(UntrustedName, match=reason):
        checked_setup(asked, ZONES)


def test_the_root_helper_takes_what_the_tunnel_sends() -> None:
    """The refusals above are of the one field changed: the request they change, and one
    with as many names as the helper takes, pass."""
    assert checked_setup(GOOD, ZONES) == SetupRequest(
        "hosts", {BROKER: "127.0.0.2"}, ["cluster.local"], ("127.0.0.1", 53)
    )
    assert len(checked_setup(_asked(names=MANY), ZONES).names) == MAX_NAMES


def test_the_root_helper_refuses_a_domain_above_a_zones_apex() -> None:
    """Bootstrap `kafka-1.team.mycorp.lan`, a broker advertised as `team.mycorp.lan`: the
    child may route `team.mycorp.lan` to the shim, never `mycorp.lan` (the company's)."""
    zones = ClusterZones.of(["kafka-1.team.mycorp.lan"])
    names = {"kafka-1.team.mycorp.lan": "127.0.0.2", "team.mycorp.lan": "127.0.0.3"}
    assert checked_setup(_asked(names=names, domains=["team.mycorp.lan"]), zones)
    with pytest.raises(UntrustedName, match=r"domain 'mycorp\.lan' is outside the cluster's"):
        checked_setup(_asked(names=names, domains=["team.mycorp.lan", "mycorp.lan"]), zones)


@pytest.mark.parametrize(
    ("line", "reason"),
    [
        ("not json\n", "a request that is not JSON"),
        ("[]\n", "neither a set-up nor a teardown"),
        (json.dumps({"setup": GOOD, "teardown": True}) + "\n", "neither a set-up nor a teardown"),
        (json.dumps({"teardown": False}) + "\n", "neither a set-up nor a teardown"),
        (json.dumps({"setup": _asked(domains=["com"])}) + "\n", "domain 'com' is outside"),
        ("x" * MAX_REQUEST, f"a request of {MAX_REQUEST} characters or more: no more served"),
    ],
    ids=["not json", "a list", "both", "teardown false", "a refused set-up", "too long"],
)
def test_the_root_helper_answers_a_refusal_and_says_it_on_stderr(
    line: str, reason: str, capsys: pytest.CaptureFixture[str]
) -> None:
    answer, done = _serve(line, ZONES)
    assert done is None and list(answer) == ["error"]
    assert answer["error"].startswith(f"the privileged helper refused the request: {reason}")
    assert capsys.readouterr().err.startswith(f"resolver helper: refused: {reason}")


def test_a_library_directory_python_never_made_does_not_stop_sudo(tmp_path: Path) -> None:
    """A fresh Debian names /usr/local/lib/python3.X/dist-packages as its purelib before
    anything was installed there. Played by a virtualenv whose site-packages is gone: the
    check of what the user can read looks at what exists and is used, and passes."""
    venv = tmp_path / "venv"
    base = getattr(sys, "_base_executable", sys.executable)
    subprocess.run([base, "-m", "venv", "--without-pip", str(venv)], check=True, timeout=120)
    python = venv / "bin" / "python"
    purelib = subprocess.run(
        [python, "-c", "import sysconfig; print(sysconfig.get_path('purelib'))"],
        capture_output=True, text=True, check=True, timeout=60,
    ).stdout.strip()  # fmt: skip
    Path(purelib).rmdir()  # empty: made by venv, nothing installed
    me = pwd.getpwuid(os.getuid())
    source = Path(kafkatunnel.__file__).parent.parent
    dependencies = sysconfig.get_path("purelib")  # this test's own, for kafkatunnel's imports
    check = (
        "import sys, sysconfig; from kafkatunnel.privileges import User, unreadable_installation;"
        "print(sysconfig.get_path('purelib'));"
        f"print(unreadable_installation(User({me.pw_uid}, {me.pw_gid}, {me.pw_name!r}, '/')))"
    )
    result = subprocess.run(
        [python, "-c", check], capture_output=True, text=True, timeout=60,
        env={**os.environ, "PYTHONPATH": os.pathsep.join([str(source), dependencies])},
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    named, unreadable = result.stdout.splitlines()
    assert named == purelib and not Path(named).exists()
    assert unreadable == "None"
