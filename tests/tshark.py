"""What tshark (Wireshark's dissector, an independent Kafka decoder) says about a capture."""

from __future__ import annotations

import subprocess
from pathlib import Path


def kafka_frames(path: Path, ports: list[int]) -> list[tuple[int, int, bool]]:
    """(api key, correlation id, is a request) of every Kafka PDU, in packet order."""
    decode_as = [arg for port in ports for arg in ("-d", f"tcp.port=={port},kafka")]
    fields = ["kafka.api_key", "kafka.correlation_id", "kafka.request_frame"]
    out = subprocess.run(
        ["tshark", "-r", str(path), *decode_as, "-T", "fields",
         *[arg for f in fields for arg in ("-e", f)], "-Y", "kafka"],
        capture_output=True, text=True, check=True, timeout=120,
    ).stdout  # fmt: skip
    frames = []
    for line in out.splitlines():
        keys, correlations, request_frames = (line.split("\t") + ["", ""])[:3]
        answers = request_frames.split(",") if request_frames else []
        for index, (key, correlation) in enumerate(
            zip(keys.split(","), correlations.split(","), strict=True)
        ):
            is_request = index >= len(answers) or not answers[index]
            frames.append((int(key), int(correlation), is_request))
    return frames
