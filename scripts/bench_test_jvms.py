"""What the test suite's JVMs cost with and without `-XX:TieredStopAtLevel=1` (the client
compiler only), side by side in one run: Apache Kafka's three brokers started and left
idle, and `kafkatunnel verify` on the committed routed recording with Spark.

CPU is the whole machine's (/proc/stat), so run it on an otherwise idle machine:
    python scripts/bench_test_jvms.py [--idle SECONDS] [--verifies N]"""

from __future__ import annotations

import argparse
import functools
import os
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

from kafkatunnel.demo import apache
from tests.worlds.apache import ApacheKafka

ROOT = Path(__file__).resolve().parents[1]
RECORDING = ROOT / "tests/data/recordings/routed"


def busy_seconds() -> float:
    fields = [int(v) for v in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:]]
    return (sum(fields) - fields[3] - fields[4]) / os.sysconf("SC_CLK_TCK")


def measured(action: Callable[[], object]) -> tuple[float, float, object]:
    """(CPU seconds, wall seconds, what `action` returned)."""
    cpu, wall = busy_seconds(), time.monotonic()
    result = action()
    return busy_seconds() - cpu, time.monotonic() - wall, result


def brokers(flags: list[str], idle: float) -> float:
    saved = apache.HEAP
    apache.HEAP = flags
    try:
        started = time.monotonic()
        with ApacheKafka():
            ready = time.monotonic() - started
            time.sleep(idle)
        return ready
    finally:
        apache.HEAP = saved


def verify(submit_opts: str | None, times: int) -> None:
    env = {k: v for k, v in os.environ.items() if k != "SPARK_SUBMIT_OPTS"}
    if submit_opts:
        env["SPARK_SUBMIT_OPTS"] = submit_opts
    for _ in range(times):
        subprocess.run([sys.executable, "-m", "kafkatunnel", "verify", str(RECORDING)],
                       check=True, capture_output=True, env=env, timeout=300)  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--idle", type=float, default=45.0)
    parser.add_argument("--verifies", type=int, default=3)
    args = parser.parse_args()
    c2 = [f for f in apache.HEAP if f != apache.JIT]
    print("| what | JIT | CPU s | wall s | brokers ready after s |\n|---|---|---:|---:|---:|")
    for name, flags in (("C1 and C2 (default)", c2), ("C1 only", [*c2, apache.JIT])):
        cpu, wall, ready = measured(functools.partial(brokers, flags, args.idle))
        print(f"| 3 brokers, started, {args.idle:.0f} s idle, stopped | {name} | {cpu:.1f} "
              f"| {wall:.1f} | {ready:.1f} |")  # fmt: skip
    for name, opts in (("C1 and C2 (default)", None), ("C1 only", apache.JIT)):
        cpu, wall, _ = measured(functools.partial(verify, opts, args.verifies))
        print(f"| `kafkatunnel verify` (Spark) x{args.verifies} | {name} | {cpu:.1f} "
              f"| {wall:.1f} | |")  # fmt: skip


if __name__ == "__main__":
    main()
