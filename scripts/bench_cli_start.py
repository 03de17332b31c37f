"""What the `kafkatunnel` command costs before it does anything: the CPU and the time of a
process that shows help, asks for the status with no tunnel running, or is given a wrong
flag, side by side with an earlier commit.

    .venv/bin/python scripts/bench_cli_start.py [--rounds 15] [--against REV]

Each command runs as `python -m kafkatunnel ...` in a process of its own, from an empty
directory (no settings file), with this tree's package first on the path, and with
--against REV also from the package as it was at REV (git archive, compiled beforehand
as this tree's is). Each round runs every
(tree, command) once, in a new random order. Prints each one's median CPU (user + system,
from wait4) and wall time over the rounds, and this tree's median CPU against REV's.
"""

from __future__ import annotations

import argparse
import compileall
import os
import random
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from bench_relay import export

COMMANDS = {
    "--help": ["--help"],
    "up --help": ["up", "--help"],
    "status (none running)": ["status"],
    "up with a wrong flag value": ["up", "--listen", "nonsense"],
}


def run_once(root: str, argv: list[str], cwd: str, state: str) -> tuple[float, float]:
    """CPU seconds and wall seconds of one `python -m kafkatunnel ARGV` from `root`."""
    env = {**os.environ, "PYTHONPATH": root, "KAFKATUNNEL_STATE_DIR": state}
    for name in [n for n in env if n.startswith("KAFKATUNNEL_") and n != "KAFKATUNNEL_STATE_DIR"]:
        del env[name]
    started = time.monotonic()
    child = subprocess.Popen(
        [sys.executable, "-m", "kafkatunnel", *argv], cwd=cwd, env=env,
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )  # fmt: skip
    _, _, usage = os.wait4(child.pid, 0)
    child.returncode = 0  # reaped above
    return usage.ru_utime + usage.ru_stime, time.monotonic() - started


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=15)
    parser.add_argument("--against", metavar="REV", help="an earlier commit, side by side")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="bench-cli-") as scratch:
        here = str(Path(__file__).resolve().parent.parent)
        trees = {"this tree": here}
        if args.against:
            earlier = os.path.join(scratch, "earlier")
            trees[export(args.against, earlier)] = earlier
            compileall.compile_dir(earlier, quiet=1)  # as this tree's: no compiling measured
        cwd, state = os.path.join(scratch, "cwd"), os.path.join(scratch, "state")
        os.makedirs(cwd)
        runs = [(tree, name) for tree in trees for name in COMMANDS]
        samples: dict[tuple[str, str], list[tuple[float, float]]] = {r: [] for r in runs}
        order = random.Random(0)
        for _ in range(args.rounds):  # interleaved: a spell of noise falls on every run
            for tree, name in order.sample(runs, len(runs)):
                samples[tree, name].append(run_once(trees[tree], COMMANDS[name], cwd, state))
    print(f"`python -m kafkatunnel ...`, {args.rounds} rounds, medians\n")
    print("| command | tree | CPU ms | wall ms |")
    print("| --- | --- | ---: | ---: |")
    cpu = {run: statistics.median(c for c, _ in s) for run, s in samples.items()}
    for (tree, name), seen in samples.items():
        wall = statistics.median(w for _, w in seen)
        print(f"| {name} | {tree} | {cpu[tree, name] * 1e3:.0f} | {wall * 1e3:.0f} |")
    others = [tree for tree in trees if tree != "this tree"]
    for other in others:
        print(f"\n| command | CPU, this tree / {other} |")
        print("| --- | ---: |")
        for name in COMMANDS:
            print(f"| {name} | {cpu['this tree', name] / cpu[other, name]:.2f} |")


if __name__ == "__main__":
    main()
