"""Recordings and captures committed under tests/data."""

from __future__ import annotations

from pathlib import Path

DATA = Path(__file__).resolve().parent.parent / "data"
ROUTED = DATA / "recordings" / "routed"
SINGLE_FORWARD = DATA / "recordings" / "single-forward.pcapng"
CAPTURES = DATA / "captures"
