"""Benchmark `kafkatunnel verify` on a recording of at least 10^6 Kafka frames, side by side
with the same job without Spark (on every core, and on one) and with tshark reading the
same files; with --baseline, also the same passes of an earlier source tree (a git
worktree), in the same run.

    .venv/bin/python scripts/bench_verify.py [--copies 1000] [--keep DIR] [--baseline DIR]
    .venv/bin/python scripts/bench_verify.py --copies 100 --stages   # where a frame's time goes

The recording is made by the real recorder from real traffic: the frames of the committed
routed session (tests/data/recordings/routed) are replayed through `Recorder` once per copy,
each copy on its own connections and with its own group and transactional ids (renamed in
place, same length), so verify has ~1000x as many groups to judge as the sample.
"""

from __future__ import annotations

import argparse
import json
import shutil
import subprocess
import sys
import tempfile
import time
import timeit
from collections.abc import Callable
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from kafkatunnel.capture.packets import Capture
from kafkatunnel.capture.pcapng import PcapngReader
from kafkatunnel.verify.calls import FileDecoder
from kafkatunnel.verify.job import (
    Report,
    cores,
    decode_file,
    spark_session,
    verify_local,
    verify_spark,
)
from tests.worlds.copies import read_sample, record_copies, tag_for

SAMPLE = Path(__file__).resolve().parent.parent / "tests" / "data" / "recordings" / "routed"


def make_recording(directory: Path, copies: int) -> int:
    sample = read_sample(sorted(SAMPLE.iterdir()))
    return record_copies(directory, sample, (tag_for(c, sample.prefix) for c in range(copies)))


def tshark(files: list[Path], ports: list[int]) -> float:
    decode_as = [arg for port in ports for arg in ("-d", f"tcp.port=={port},kafka")]
    start = time.perf_counter()
    for path in files:
        subprocess.run(
            ["tshark", "-r", str(path), *decode_as, "-T", "fields", "-e", "kafka.api_key",
             "-e", "kafka.correlation_id"],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, check=True,
        )  # fmt: skip
    return time.perf_counter() - start


BASELINE = """
import json, sys, time
sys.path.insert(0, sys.argv[1])
from kafkatunnel.verify.job import spark_session, verify_local, verify_spark
start = time.perf_counter()
local = verify_local([sys.argv[2]])
local_s = time.perf_counter() - start
spark = spark_session("local[*]")
start = time.perf_counter()
distributed = verify_spark([sys.argv[2]], spark)
spark_s = time.perf_counter() - start
spark.stop()
print(json.dumps({"spark": spark_s, "local": local_s, "ok": local.ok and distributed.ok}))
"""


def baseline(tree: Path, recording: Path) -> dict[str, float]:
    """The Spark and in-process passes of the source tree at `tree`, in a process of its own."""
    out = subprocess.run(
        [sys.executable, "-c", BASELINE, str(tree.resolve()), str(recording)],
        capture_output=True, text=True, check=True, cwd=tree,
    )  # fmt: skip
    found: dict[str, float] = json.loads(out.stdout.strip().splitlines()[-1])
    return found


def stages(files: list[Path], frames: int) -> None:
    """One process's time per frame, stage by stage (best of three; each stage includes the
    ones above it, the difference is its own)."""
    datas = [path.read_bytes() for path in files]
    steps: list[tuple[str, Callable[[], object]]] = [
        ("pcapng blocks", lambda: [sum(1 for _ in PcapngReader(d)) for d in datas]),
        ("IPv4 and TCP headers", lambda: [sum(1 for _ in Capture(d).segments()) for d in datas]),
        ("reassembly, framing, pairing", lambda: [FileDecoder("x", d).run() for d in datas]),
        ("what verify reads of Kafka", lambda: [decode_file("x", d) for d in datas]),
        ("gathering and judging", lambda: verify_local([str(f) for f in files], workers=1)),
    ]
    before = 0.0
    for name, run in steps:
        best = min(timeit.repeat(run, number=1, repeat=3))
        print(f"{name:<32}{(best - before) / frames * 1e6:>7.2f} us per frame")
        before = best
    print(f"{'in all':<32}{before / frames * 1e6:>7.2f} us per frame")


def timed(run: Callable[[], Report]) -> tuple[float, Report]:
    start = time.perf_counter()
    report = run()
    return time.perf_counter() - start, report


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--copies", type=int, default=1000)
    parser.add_argument("--keep", type=Path, help="keep the recording in this directory")
    parser.add_argument("--stages", action="store_true", help="only time one process's stages")
    parser.add_argument(
        "--baseline", type=Path, metavar="DIR",
        help="an earlier source tree (git worktree add DIR REV) to run too",
    )  # fmt: skip
    args = parser.parse_args()
    directory = args.keep or Path(tempfile.mkdtemp(prefix="kt-bench-verify-"))
    start = time.perf_counter()
    written = make_recording(directory, args.copies)
    files = sorted(directory.iterdir())
    size = sum(p.stat().st_size for p in files)
    print(f"recording: {written:,} frames in {len(files)} files, {size / 2**20:.0f} MiB "
          f"(made in {time.perf_counter() - start:.0f} s)")  # fmt: skip
    if args.stages:
        stages(files, written)
        return 0

    local_s, local = timed(lambda: verify_local([str(directory)]))
    assert local.frames == written and local.ok, (local.frames, written)
    one_s, one = timed(lambda: verify_local([str(directory)], workers=1))
    assert one.as_dict() == local.as_dict()
    start = time.perf_counter()
    spark = spark_session("local[*]")
    startup = time.perf_counter() - start
    spark_s, distributed = timed(lambda: verify_spark([str(directory)], spark))
    spark.stop()
    assert distributed.as_dict() == local.as_dict()
    before = baseline(args.baseline, directory) if args.baseline else None

    listeners = read_sample(files[:1]).conversations
    ports = sorted({int(c.listener.tunnel.rsplit(":", 1)[1]) for c in listeners})
    tshark_s = tshark(files, ports) if shutil.which("tshark") else float("nan")

    groups = len(local.verdicts)
    print(f"{groups} groups and transactional ids judged, all ok: {local.ok}")
    rows = [
        ("verify on Spark, local[*]", spark_s, before["spark"] if before else None),
        (
            f"verify without Spark, {cores()} processes",
            local_s,
            before["local"] if before else None,
        ),
        ("verify without Spark, one process", one_s, before["local"] if before else None),
        ("tshark -T fields (Kafka dissector)", tshark_s, None),
    ]
    print(f"{'pass':<40}{'seconds':>9}{'frames/s':>12}{'vs tshark':>11}"
          + (f"{'baseline s':>12}{'speed-up':>10}" if before else ""))  # fmt: skip
    for name, seconds, earlier in rows:
        line = (f"{name:<40}{seconds:>9.1f}{written / seconds:>12,.0f}"
                f"{tshark_s / seconds:>10.1f}x")  # fmt: skip
        if earlier:
            line += f"{earlier:>12.1f}{earlier / seconds:>9.2f}x"
        print(line)
    print(f"(Spark session start-up, not counted above: {startup:.1f} s)")
    if args.keep is None:
        shutil.rmtree(directory)
    return 0


if __name__ == "__main__":
    sys.exit(main())
