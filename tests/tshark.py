"""What tshark (Wireshark's dissector, an independent Kafka decoder) says about a capture."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path
from typing import Any


def kafka_frames(path: Path, ports: list[int]) -> list[tuple[int, int, bool]]:
    """(api key, correlation id, is a request) of every Kafka PDU, in packet order, with
    Kafka decoded on `ports` (a PDU sent to one of them is a request). -1: tshark did not
    tell the API of a response (its request is not in the file, or a version it lacks)."""
    decode_as = [arg for port in ports for arg in ("-d", f"tcp.port=={port},kafka")]
    out = subprocess.run(
        ["tshark", "-r", str(path), *decode_as, "-Y", "kafka", "-T", "json",
         "--no-duplicate-keys", "-J", "tcp kafka"],
        capture_output=True, text=True, check=True, timeout=120,
    ).stdout  # fmt: skip
    frames = []
    for packet in json.loads(out or "[]"):
        layers = packet["_source"]["layers"]
        to_server = int(layers["tcp"]["tcp.dstport"]) in ports
        pdus: Any = layers["kafka"]
        for pdu in pdus if isinstance(pdus, list) else [pdus]:
            key = pdu.get("kafka.api_key")
            frames.append((int(key) if key is not None else -1,
                           int(pdu["kafka.correlation_id"]), to_server))  # fmt: skip
    return frames
