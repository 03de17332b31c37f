"""Recordings committed under tests/data, and one Spark session for the tests that use it."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

DATA = Path(__file__).resolve().parent.parent / "data"
ROUTED = DATA / "recordings" / "routed"
SINGLE_FORWARD = DATA / "recordings" / "single-forward.pcapng"
CAPTURES = DATA / "captures"


@pytest.fixture(scope="session")
def spark() -> Iterator[Any]:
    from kafkatunnel.verify.job import spark_session

    session = spark_session("local[2]")
    yield session
    session.stop()
