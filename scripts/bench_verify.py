"""Benchmark `kafkatunnel verify` on a recording of at least 10^6 Kafka frames, side by side
with the same decoding in one process and with tshark reading the same files.

    .venv/bin/python scripts/bench_verify.py [--copies 1000] [--keep DIR]

The recording is made by the real recorder from real traffic: the frames of the committed
routed session (tests/data/recordings/routed) are replayed through `Recorder` once per copy,
each copy on its own connections and with its own group and transactional ids (renamed in
place, same length), so verify has ~1000x as many groups to judge as the sample.
"""

from __future__ import annotations

import argparse
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from kafkatunnel.localcluster.copies import read_sample, record_copies, tag_for
from kafkatunnel.verify.job import spark_session, verify_local, verify_spark

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


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--copies", type=int, default=1000)
    parser.add_argument("--keep", type=Path, help="keep the recording in this directory")
    args = parser.parse_args()
    directory = args.keep or Path(tempfile.mkdtemp(prefix="kt-bench-verify-"))
    start = time.perf_counter()
    written = make_recording(directory, args.copies)
    files = sorted(directory.iterdir())
    size = sum(p.stat().st_size for p in files)
    print(f"recording: {written:,} frames in {len(files)} files, {size / 2**20:.0f} MiB "
          f"(made in {time.perf_counter() - start:.0f} s)")  # fmt: skip

    start = time.perf_counter()
    local = verify_local([str(directory)])
    local_s = time.perf_counter() - start
    assert local.frames == written and local.ok, (local.frames, written)

    start = time.perf_counter()
    spark = spark_session("local[*]")
    startup = time.perf_counter() - start
    start = time.perf_counter()
    distributed = verify_spark([str(directory)], spark)
    spark_s = time.perf_counter() - start
    spark.stop()
    assert distributed.as_dict() == local.as_dict()

    listeners = read_sample(files[:1]).conversations
    ports = sorted({int(c.listener.tunnel.rsplit(":", 1)[1]) for c in listeners})
    tshark_s = tshark(files, ports) if shutil.which("tshark") else float("nan")

    groups = len(local.verdicts)
    print(f"{groups} groups and transactional ids judged, all ok: {local.ok}")
    print(f"{'pass':<34}{'seconds':>9}{'frames/s':>12}{'vs tshark':>11}")
    for name, seconds in (
        ("verify on Spark, local[*] (2 cores)", spark_s),
        ("verify in one process", local_s),
        ("tshark -T fields (Kafka dissector)", tshark_s),
    ):
        print(f"{name:<34}{seconds:>9.1f}{written / seconds:>12,.0f}{tshark_s / seconds:>10.1f}x")
    print(f"(Spark session start-up, not counted above: {startup:.1f} s)")
    if args.keep is None:
        shutil.rmtree(directory)
    return 0


if __name__ == "__main__":
    sys.exit(main())
