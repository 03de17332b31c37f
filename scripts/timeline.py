"""Where a run of the suite spent its time, from the timeline it wrote with
KT_TESTS_TIMELINE=FILE (tests/scheduling.py): each worker's span and busy time, the groups
of shared worlds by their time, and the slowest tests. The run is as short as its busiest
worker: a group that fills one worker while others idle is the one to split or speed up.

    KT_TESTS_TIMELINE=/tmp/timeline.jsonl scripts/test
    .venv/bin/python scripts/timeline.py /tmp/timeline.jsonl
"""

from __future__ import annotations

import argparse
import json
from collections import defaultdict
from pathlib import Path
from typing import Any


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("timeline", type=Path, help="the file KT_TESTS_TIMELINE named")
    parser.add_argument("--top", type=int, default=15, help="how many groups and tests to list")
    args = parser.parse_args()
    rows = [json.loads(line) for line in args.timeline.read_text().splitlines() if line]
    if not rows:
        raise SystemExit(f"{args.timeline} holds no test")
    start = min(r["start"] for r in rows)
    print(f"{len(rows)} tests in {max(r['end'] for r in rows) - start:.0f} s\n")
    by_worker: dict[str, list[dict[str, Any]]] = defaultdict(list)
    for row in rows:
        by_worker[row["worker"]].append(row)
    print("worker  tests  busy s  ends at s")
    for worker, mine in sorted(by_worker.items()):
        busy = sum(r["end"] - r["start"] for r in mine)
        print(f"{worker:6} {len(mine):6} {busy:7.0f} {max(r['end'] for r in mine) - start:10.0f}")
    groups: dict[str, list[dict[str, Any]]] = defaultdict(list)
    for row in rows:
        groups[row["group"] or "(none)"].append(row)
    print("\ngroup (worker)                                        tests  time s   from s    to s")
    ranked = sorted(groups.items(), key=lambda g: -sum(r["end"] - r["start"] for r in g[1]))
    for group, mine in ranked[: args.top]:
        total = sum(r["end"] - r["start"] for r in mine)
        workers = ",".join(sorted({r["worker"] for r in mine}))
        first, last = min(r["start"] for r in mine) - start, max(r["end"] for r in mine) - start
        label = f"{group[-44:]} ({workers})"
        print(f"{label:53} {len(mine):5} {total:7.0f} {first:8.0f} {last:7.0f}")
    print("\nslowest tests (set-up and tear-down included)")
    for row in sorted(rows, key=lambda r: r["start"] - r["end"])[: args.top]:
        print(f"{row['end'] - row['start']:6.0f} s  {row['worker']}  {row['test']}")


if __name__ == "__main__":
    main()
