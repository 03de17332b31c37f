"""The commands in README.md and docs/ hold: every shell block either runs here, as
written, or says in its fence what it needs that a test machine lacks.

A fence's second word is that need: ```bash kubernetes (a cluster in Kubernetes),
spark-cluster (HDFS or YARN), benchmark (minutes of measuring, run by hand), docker (a
Docker daemon), setup (the README's own two commands, which CI runs). Their `kafkatunnel`
lines are still parsed by the real command line, so a renamed flag fails here; their scripts
must exist and know the flags.

Every other block runs with bash inside a network namespace that plays the laptop: a tunnel
on 127.0.0.1:9092 (as the docs assume) to the local cluster, recording to recordings/, with
a topic `orders`, and an S3 server named by the usual AWS variables. A line ending in
`# until Ctrl-C` runs while traffic goes through the tunnel, then gets Ctrl-C. A console
block (`$ command` and what it prints) runs in a directory holding its document's
kafkatunnel.toml, and must print the lines it shows.
"""

from __future__ import annotations

import os
import re
import shlex
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from typer.core import TyperGroup

from kafkatunnel.cli.main import command as kafkatunnel_command
from kafkatunnel.demo import LocalCluster
from kafkatunnel.demo.netns import NetworkNamespace
from kafkatunnel.demo.processes import ManagedProcess

ROOT = Path(__file__).resolve().parent.parent
DOCUMENTS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
FENCE = re.compile(r"^```(\w+)[ \t]*([\w-]*)[^\n]*\n(.*?)^```[ \t]*$", re.S | re.M)
SHELLS = {"bash", "sh", "console"}
NEEDS = {
    "kubernetes": "a cluster in Kubernetes",
    "spark-cluster": "HDFS or YARN",
    "benchmark": "minutes of measuring",
    "setup": "a fresh machine (CI runs these)",
    "docker": "a Docker daemon (tests/docker/ runs the recipes with one)",
}
UNTIL_INTERRUPTED = "# until Ctrl-C"
BOX = re.compile(r"[│┃┏┓┗┛┡┩┠┨┯┷┳┻╇╈━─┼╋┣┫┬┴├┤┌┐└┘]")


@dataclass(frozen=True)
class Block:
    document: Path
    line: int
    language: str
    need: str
    text: str

    @property
    def name(self) -> str:
        return f"{self.document.relative_to(ROOT)}:{self.line}"

    def lines(self) -> list[str]:
        """Its command lines, continuations joined (console: the `$ ` lines only)."""
        joined = self.text.replace("\\\n", " ").splitlines()
        if self.language == "console":
            joined = [line[2:] for line in joined if line.startswith("$ ")]
        if self.language == "yaml":  # a CI file: the kafkatunnel lines of its steps
            joined = [re.sub(r"^\s*(- )?(run:)?\s*", "", line) for line in joined]
            joined = [line for line in joined if line.startswith("kafkatunnel ")]
        return [line.strip() for line in joined if line.strip() and not line.startswith("#")]

    def output(self) -> list[str]:
        """A console block's printed lines (not `...`)."""
        printed = [line for line in self.text.splitlines() if not line.startswith("$ ")]
        return [line for line in printed if line.strip() not in ("", "...")]


def blocks() -> list[Block]:
    found = []
    for document in DOCUMENTS:
        text = document.read_text()
        for match in FENCE.finditer(text):
            language, need, body = match.groups()
            if language in SHELLS or language == "yaml":
                line = text.count("\n", 0, match.start()) + 1
                found.append(Block(document, line, language, need, body))
    return found


BLOCKS = blocks()
NOT_RUN = [b for b in BLOCKS if b.need or b.language == "yaml"]
RUN = [b for b in BLOCKS if b not in NOT_RUN]


def test_every_block_runs_or_names_what_it_needs() -> None:
    assert RUN and NOT_RUN
    for block in BLOCKS:
        assert block.need in ("", *NEEDS), f"{block.name}: unknown need {block.need!r}"


# -- blocks that are not run: still parsed -----------------------------------------------------


def _words(line: str) -> list[str]:
    """The first command of a shell line: no sudo, variables, pipes or redirections."""
    lexer = shlex.shlex(line, posix=True, punctuation_chars=True)
    lexer.whitespace_split = True
    words: list[str] = []
    for word in lexer:
        if set(word) <= set("();<>|&"):
            break
        words.append(word)
    while words and (words[0] == "sudo" or re.match(r"^[A-Z_]+=", words[0])):
        words.pop(0)
    return words


def _parse(command: Any, args: list[str], parent: Any, name: str) -> None:
    """Parse as click would (its classes are typer's private names: taken as they come)."""
    ctx = command.make_context(name, list(args), parent=parent)
    if isinstance(command, TyperGroup):
        rest = [*getattr(ctx, "_protected_args", getattr(ctx, "protected_args", [])), *ctx.args]
        sub_name, sub, rest = command.resolve_command(ctx, rest)
        assert sub is not None and sub_name is not None
        _parse(sub, rest, ctx, sub_name)


@pytest.mark.parametrize("block", NOT_RUN, ids=[b.name for b in NOT_RUN])
def test_commands_of_blocks_not_run_still_parse(block: Block) -> None:
    for line in block.lines():
        words = _words(line)
        if not words:
            continue
        if words[0] == "kafkatunnel":
            _parse(kafkatunnel_command(), words[1:], None, "kafkatunnel")
        elif len(words) > 1 and words[1].startswith("scripts/"):
            script = ROOT / words[1]
            assert script.is_file(), f"{block.name}: {words[1]} does not exist"
            helped = subprocess.run([sys.executable, str(script), "--help"], capture_output=True,
                                    text=True, timeout=60, cwd=ROOT)  # fmt: skip
            assert helped.returncode == 0, f"{block.name}: {words[1]} --help: {helped.stderr}"
            usage = helped.stdout
            for flag in (w.split("=")[0] for w in words[2:] if w.startswith("--")):
                assert flag in usage, f"{block.name}: {words[1]} has no {flag}"
        elif words[0].startswith("scripts/"):
            assert (ROOT / words[0]).is_file(), f"{block.name}: {words[0]} does not exist"


def test_the_benchmarks_run_on_the_set_up_their_page_names() -> None:
    """They need the suite's set-up (kafka-python, Apache Kafka's jars, the test worlds),
    not the demo's: their page gives the one command that makes it before its first
    benchmark, and each benchmark runs with the Python of the virtualenv it makes (the one
    this suite runs in: the test above asks each script's --help of it)."""
    page = [b for b in BLOCKS if b.document == ROOT / "docs/benchmarks.md"]
    setup = [b for b in page if b.need == "setup" and "scripts/test --setup-only" in b.lines()]
    benchmarks = [b for b in BLOCKS if b.need == "benchmark"]
    assert setup and benchmarks, "docs/benchmarks.md says how to set the benchmarks up"
    assert setup[0].line < min(b.line for b in page if b.need == "benchmark")
    assert '"--setup-only"' in (ROOT / "scripts/test").read_text()
    for block in benchmarks:
        for words in map(_words, block.lines()):
            if len(words) > 1 and words[1].startswith("scripts/"):
                assert words[0] == ".venv/bin/python", f"{block.name}: {' '.join(words[:2])}"


# -- blocks that run ------------------------------------------------------------------------------


@dataclass
class Laptop:
    namespace: NetworkNamespace
    work: Path
    env: dict[str, str]

    def bash(self, script: str, cwd: Path) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [*self.namespace.exec_prefix(), "bash", "-c", script],
            capture_output=True, text=True, timeout=BLOCK_TIMEOUT, cwd=cwd, env=self.env,
        )  # fmt: skip


# A block that runs `verify` on Spark spends about 40 s of CPU (37 s measured for one
# `verify s3a://` in local mode); beside the suite's brokers and clusters on two cores and
# a background load it gets a fraction of one: 180 s ran out on a busy 2-core machine.
BLOCK_TIMEOUT = 420


@pytest.fixture(scope="module")
def laptop(cluster: LocalCluster, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Laptop]:
    work = tmp_path_factory.mktemp("docs")
    bin_dir = Path(sys.executable).parent
    env = {**os.environ, "PATH": f"{bin_dir}:{os.environ['PATH']}",
           "KAFKATUNNEL_STATE_DIR": str(work / "state")}  # fmt: skip
    for name in ("COLUMNS", "KAFKATUNNEL_PROFILE", "KAFKATUNNEL_CONFIG"):
        env.pop(name, None)
    env.update(S3_ENVIRONMENT)
    with NetworkNamespace() as namespace:
        s3 = ManagedProcess(
            [*namespace.exec_prefix(), sys.executable, "-m", "moto.server", "-H", "127.0.0.1",
             "-p", "9000"], name="docs-s3", env=env,
        )  # fmt: skip
        up = ManagedProcess(
            [*namespace.exec_prefix(), sys.executable, "-m", "kafkatunnel", "up",
             "--bootstrap", cluster.mock[0].address, "--exec", cluster.exec_template(),
             "--listen", "127.0.0.1:9092", "--record", str(work / "recordings"),
             "--record-rotate", "16KiB", "--no-table"],
            name="docs-tunnel", env=env,
        )  # fmt: skip
        try:
            up.wait_for_line(r"^bootstrap\.servers=127\.0\.0\.1:9092$", timeout=30)
            s3.wait_for_line(r"Running on http://127\.0\.0\.1:9000", timeout=30)
            laptop = Laptop(namespace, work, env)
            seeded = laptop.bash(f"{TRAFFIC}\nkt_traffic", work)
            assert seeded.returncode == 0, seeded.stdout + seeded.stderr
            yield laptop
        finally:
            up.stop()
            s3.stop()


# What a CI runner's environment holds for object storage: a local S3 server (moto's) in the
# laptop's namespace, and credentials it accepts
S3_ENVIRONMENT = {"AWS_ENDPOINT_URL": "http://127.0.0.1:9000", "AWS_REGION": "us-east-1",
                  "AWS_ACCESS_KEY_ID": "docs", "AWS_SECRET_ACCESS_KEY": "docs-secret"}  # fmt: skip

# Traffic through the tunnel: messages in `orders`, and a group that reads them.
TRAFFIC = f"""
kt_traffic() {{
    local workload="{sys.executable} -m kafkatunnel.demo.workload"
    $workload produce 127.0.0.1:9092 orders 20 >/dev/null
    $workload consume 127.0.0.1:9092 "docs-$RANDOM" orders 20 >/dev/null
}}
"""

PRELUDE = f"""set -euo pipefail
set -m  # background jobs in their own process group, so that Ctrl-C reaches them
command -v sudo >/dev/null || sudo() {{ "$@"; }}
{TRAFFIC}
kt_until_started() {{  # a capture says "listening on" once it captures
    local deadline=$((SECONDS + 20))
    until grep -q "listening on" "$1"; do
        if [ $SECONDS -ge $deadline ]; then cat "$1" >&2; return 1; fi
        sleep 0.1
    done
}}
"""


def script_of(block: Block) -> str:
    lines = [PRELUDE]
    for line in block.lines():
        if line.endswith(UNTIL_INTERRUPTED):
            lines.append(f"{{ {line.removesuffix(UNTIL_INTERRUPTED)} ; }} 2> started.log &")
            lines.append("running=$!; kt_until_started started.log; kt_traffic")
            lines.append('kill -INT -- "-$running"; wait "$running" || true')
        else:
            lines.append(line)
    return "\n".join(lines) + "\n"


def _flat(text: str) -> str:
    return " ".join(BOX.sub(" ", text).split())


@pytest.mark.parametrize("block", RUN, ids=[b.name for b in RUN])
def test_a_block_runs_as_written(block: Block, laptop: Laptop, tmp_path: Path) -> None:
    cwd = laptop.work
    if block.language == "console":
        cwd = tmp_path
        for toml in re.findall(r"^```toml\n(.*?)^```", block.document.read_text(), re.S | re.M):
            (cwd / "kafkatunnel.toml").write_text(toml)
    result = laptop.bash(script_of(block), cwd)
    assert result.returncode == 0, f"{block.name}\n{block.text}\n{result.stdout}\n{result.stderr}"
    assert "Traceback" not in result.stdout + result.stderr
    printed = _flat(result.stdout)
    for line in block.output() if block.language == "console" else []:
        assert _flat(line) in printed, f"{block.name}: {line!r} not in\n{result.stdout}"


def test_every_security_claim_names_a_test_that_exists() -> None:
    """docs/security.md backs each claim with a test: each one it names must exist."""
    text = (ROOT / "docs" / "security.md").read_text()
    named = re.findall(r"`(tests/[\w/]+\.py)::(\w+)`", text)
    assert len(named) >= 15, named
    for path, test in named:
        source = (ROOT / path).read_text()
        assert re.search(rf"^def {test}\(", source, re.M), f"{path}::{test} does not exist"
