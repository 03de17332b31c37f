"""The command starts quickly: reading its flags, --help, `status` and a mistyped flag load
typer and rich, not the tunnel behind them (kio's schemas, cryptography, the protocol,
Spark), which `up`, `verify` and the others load when they run."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

import kafkatunnel.tunnel

pytestmark = pytest.mark.quick

HEAVY = ("kio", "cryptography", "kafkatunnel.tunnel.proxy", "kafkatunnel.protocol",
         "confluent_kafka", "pyspark", "hypothesis")  # fmt: skip
# A fresh interpreter: the click command built as `kafkatunnel` builds it, then what it loaded
BUILD = (
    "import json, sys\n"
    "import kafkatunnel.cli.main\n"
    "kafkatunnel.cli.main.command()\n"
    "print(json.dumps(sorted(sys.modules)))\n"
)
# A fresh interpreter running `kafkatunnel ARGS` (argv[1], JSON): what it loaded by its exit
RUN = (
    "import json, sys\n"
    "args, out = json.loads(sys.argv[1]), sys.argv[2]\n"
    "sys.argv = ['kafkatunnel', *args]\n"
    "from kafkatunnel.cli.main import main\n"
    "try:\n"
    "    main()\n"
    "finally:\n"
    "    with open(out, 'w') as file:\n"
    "        json.dump(sorted(sys.modules), file)\n"
)


def heavy_of(loaded: list[str]) -> list[str]:
    return sorted(m for m in loaded if m in HEAVY or m.startswith(tuple(f"{h}." for h in HEAVY)))


def test_building_the_command_loads_nothing_heavy() -> None:
    done = subprocess.run(
        [sys.executable, "-c", BUILD], capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, done.stderr
    loaded = json.loads(done.stdout)
    assert "kafkatunnel.cli.main" in loaded  # the probe ran what it says
    assert heavy_of(loaded) == [], f"building the command loaded {heavy_of(loaded)}"


NO_TUNNEL = [
    (["--help"], 0, "Usage: kafkatunnel"),
    (["up", "--help"], 0, "--bootstrap"),
    (["verify", "--help"], 0, "--in-process"),
    (["status"], 1, "no running tunnel"),
    (["down"], 1, "no running tunnel"),
    (["config", "show", "--json"], 0, "listen"),
    (["up", "--no-such-flag"], 2, "No such option"),
    (
        ["up", "--via", "direct", "--bootstrap", "kafka:9092", "--listen", "nonsense"],
        2,
        "'nonsense' is not HOST:PORT",
    ),
    (["up", "--exec", "ssh bastion nc {host}", "--bootstrap", "kafka:9092"], 2, "no {port}"),
]


@pytest.mark.parametrize(
    ("args", "code", "said"), NO_TUNNEL, ids=[" ".join(a) for a, *_ in NO_TUNNEL]
)
def test_commands_that_need_no_tunnel_load_nothing_heavy(
    tmp_path: Path, args: list[str], code: int, said: str
) -> None:
    """Each says what it always said (a tunnel state directory of its own: none runs)."""
    out = tmp_path / "modules.json"
    env = {
        name: value for name, value in os.environ.items() if not name.startswith("KAFKATUNNEL_")
    }  # no settings of the user's
    env["KAFKATUNNEL_STATE_DIR"] = str(tmp_path / "state")
    done = subprocess.run(
        [sys.executable, "-c", RUN, json.dumps(args), str(out)],
        capture_output=True, text=True, timeout=120, env=env, cwd=tmp_path,
    )  # fmt: skip
    assert done.returncode == code, done.stdout + done.stderr
    assert said in done.stdout + done.stderr
    loaded = json.loads(out.read_text())
    assert heavy_of(loaded) == [], f"`kafkatunnel {' '.join(args)}` loaded {heavy_of(loaded)}"


def test_the_tunnel_package_names_load_on_first_use() -> None:
    """kafkatunnel.tunnel's names, loaded from their modules when first asked for: not
    with the package (in a fresh interpreter), and each the one its module defines."""
    fresh = subprocess.run(
        [sys.executable, "-c", "import sys, kafkatunnel.tunnel as t; "
         "print('kafkatunnel.tunnel.tunnel' in sys.modules, 'Tunnel' in dir(t))"],
        capture_output=True, text=True, timeout=60, check=True,
    )  # fmt: skip
    assert fresh.stdout.split() == ["False", "True"], fresh.stdout + fresh.stderr
    names = kafkatunnel.tunnel.__all__
    assert sorted(kafkatunnel.tunnel.HOMES) == sorted(names)
    for name in names:
        value = getattr(kafkatunnel.tunnel, name)
        assert getattr(value, "__name__", None) == name, name
    unknown = "NoSuchName"  # (to mypy, a misspelt name is an error already)
    with pytest.raises(AttributeError):
        getattr(kafkatunnel.tunnel, unknown)


def test_the_coordinator_default_is_the_protocols() -> None:
    """`coordinator --partitions` shows Kafka's default without loading the protocol: the
    two say the same."""
    from kafkatunnel.cli.coordinator import PARTITIONS
    from kafkatunnel.protocol import DEFAULT_PARTITIONS

    assert PARTITIONS == DEFAULT_PARTITIONS
