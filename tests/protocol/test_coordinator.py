"""partition_for against vectors derived with the JDK's own String.hashCode."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from kafkatunnel.protocol.coordinator import java_string_hash, kafka_abs, partition_for

pytestmark = pytest.mark.quick

JDK = Path(__file__).parent.parent / "data" / "jdk"
VECTORS = [line.split("\t") for line in (JDK / "coordinator_vectors.tsv").read_text().splitlines()]


def _key(hex_units: str) -> str:
    return bytes.fromhex(hex_units).decode("utf-16-be", "surrogatepass")


@pytest.mark.parametrize(("units", "hash_code", "p50", "p7"), VECTORS)
def test_matches_the_jdk(units: str, hash_code: str, p50: str, p7: str) -> None:
    key = _key(units)
    assert java_string_hash(key) == int(hash_code)
    assert partition_for(key) == int(p50)
    assert partition_for(key, 7) == int(p7)


def test_vectors_cover_the_hard_cases() -> None:
    keys = [_key(units) for units, *_ in VECTORS]
    assert any(int(h) == -(2**31) for _, h, *_ in VECTORS), "a hash equal to Integer.MIN_VALUE"
    assert any(any(ord(c) > 0xFFFF for c in k) for k in keys), "a character outside the BMP"
    assert any(any(0x80 <= ord(c) <= 0xFFFF for c in k) for k in keys), "non-ASCII in the BMP"


def test_min_value_hash_is_partition_zero_not_abs_of_remainder() -> None:
    assert java_string_hash("polygenelubricants") == -(2**31)
    assert partition_for("polygenelubricants") == 0
    assert abs(-(2**31) % 50 - 50) == 48  # what abs(h % 50) in Java would have given


def test_kafka_abs() -> None:
    assert kafka_abs(-(2**31)) == 0
    assert kafka_abs(-5) == 5
    assert kafka_abs(2**31 - 1) == 2**31 - 1


@pytest.mark.skipif(shutil.which("javac") is None, reason="needs a JDK (javac) to re-derive")
@settings(max_examples=1, deadline=None)
@given(keys=st.lists(st.text(max_size=30), min_size=200, max_size=200))
def test_generated_keys_match_a_live_jdk(
    keys: list[str], tmp_path_factory: pytest.TempPathFactory
) -> None:
    build = tmp_path_factory.mktemp("jdk")
    subprocess.run(["javac", "-d", str(build), str(JDK / "CoordinatorVectors.java")], check=True)
    lines = "\n".join(k.encode("utf-16-be", "surrogatepass").hex() for k in keys) + "\n"
    out = subprocess.run(
        ["java", "-cp", str(build), "CoordinatorVectors"],
        input=lines,
        capture_output=True,
        text=True,
        check=True,
    ).stdout.splitlines()
    assert len(out) == len(keys)
    for key, row in zip(keys, out, strict=True):
        _, hash_code, p50, _ = row.split("\t")
        assert (java_string_hash(key), partition_for(key)) == (int(hash_code), int(p50))


def test_partitions_must_be_positive() -> None:
    with pytest.raises(ValueError, match="positive"):
        partition_for("g", 0)
