"""Instructions the running tunnel spends per MB produced through it, counted by valgrind.

    .venv/bin/python scripts/bench_tunnel_instructions.py [--variants plain,record]
        [--baseline DIR]

The tunnel bench's relay CPU (bench_tunnel.py) is this shared machine's seconds of the
moment: the same code measured twice differs by more than a recording costs. This runs
`kafkatunnel up --via direct` under valgrind's callgrind, in front of a tansu broker, and
produces through it with confluent-kafka as bench_tunnel does (1 KiB values, acks=1),
twice: 2,000 messages, then 42,000. The difference of the two counts, divided by the 40 MB
between them, is what the tunnel spends per MB produced: start-up and connecting fall out.
User-space instructions only (the kernel's splices are not counted), and a running tunnel
is not a replay: how reads fall still varies a little from run to run.

Variants: plain (no recording), record (--record DIR), record-payloads; --baseline DIR
also runs each variant from another source tree (a git worktree of an earlier commit).
"""

from __future__ import annotations

import argparse
import os
import re
import sys
import tempfile
import time
import uuid
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench_tunnel import VALUE, produce

from kafkatunnel.localcluster import free_port
from kafkatunnel.localcluster.harness import TANSU_HOST, start_tansu
from kafkatunnel.localcluster.processes import ManagedProcess

# each variant's flags; DIR: the recording's directory
FLAGS = {
    "plain": [],
    "record": ["--record", "DIR"],
    "record-payloads": ["--record", "DIR", "--record-payloads"],
}
FEW, MANY = 2_000, 42_000


def instructions(variant: str, messages: int, tree: str | None) -> int:
    """Instructions a tunnel of this variant ran, start to stop, with `messages` produced."""
    port, listen = free_port(), free_port()
    broker = start_tansu(port, f"{TANSU_HOST}:{port}", silent=True)
    scratch = Path(tempfile.mkdtemp(prefix="kafkatunnel-bench-instructions-"))
    flags = [
        x for f in FLAGS[variant] for x in ([f, str(scratch / "rec")] if f == "--record" else [f])
    ]
    out = scratch / "callgrind.out"
    env = {
        "KAFKATUNNEL_STATE_DIR": str(scratch / "state"),
        **({"PYTHONPATH": tree} if tree else {}),
    }
    tunnel = ManagedProcess(
        ["valgrind", "--tool=callgrind", f"--callgrind-out-file={out}",
         sys.executable, "-P", "-m", "kafkatunnel", "up", "--bootstrap", f"{TANSU_HOST}:{port}",
         "--via", "direct", "--map", f"{TANSU_HOST}:{port}=127.0.0.1:{port}",
         "--listen", f"127.0.0.1:{listen}", "--no-table", *flags],
        name=f"callgrind-{variant}",
        env=env,
    )  # fmt: skip
    try:
        tunnel.wait_for_line(r"^bootstrap\.servers=", timeout=300)
        produce(f"127.0.0.1:{listen}", f"instructions-{uuid.uuid4().hex[:6]}", messages)
    finally:
        tunnel.stop()
        broker.stop()
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline and not (out.exists() and out.stat().st_size):
        time.sleep(0.2)
    found = re.search(r"^summary: (\d+)", out.read_text(), re.M)
    if found is None:
        raise RuntimeError(f"callgrind wrote no summary to {out}")
    return int(found.group(1))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--variants", default="plain,record")
    parser.add_argument("--baseline", help="also run each variant from this source tree")
    args = parser.parse_args()
    trees: list[tuple[str, str | None]] = [("", None)]
    if args.baseline:
        trees.append((" (baseline)", os.path.abspath(args.baseline)))
    megabytes = (MANY - FEW) * VALUE / 1e6
    print("| tunnel | instructions per MB produced |")
    print("| --- | ---: |")
    for variant in args.variants.split(","):
        for label, tree in trees:
            few = instructions(variant, FEW, tree)
            many = instructions(variant, MANY, tree)
            print(f"| {variant}{label} | {(many - few) / megabytes:,.0f} |", flush=True)


if __name__ == "__main__":
    main()
