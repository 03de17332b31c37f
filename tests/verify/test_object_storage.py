"""`verify s3a://bucket/prefix/`: recordings read from a local S3 server (moto) through
Hadoop's S3A connector, the one matching PySpark's Hadoop, on a standalone cluster, with
the verdicts of the same files read locally. Credentials come from the environment (the
driver's, and the cluster workers' own), never from a flag. Local mode reads object storage
in the docs tests (docs/recording-and-verify.md, the gate with recordings in a bucket)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from kafkatunnel.capture.recorder import Listener
from kafkatunnel.localcluster.copies import read_sample, record_copies
from kafkatunnel.verify.job import verify_local
from kafkatunnel.verify.objectstore import ObjectStoreError, object_store_settings
from tests.verify.conftest import ROUTED, S3_CREDENTIALS

BUCKET, PREFIX = "recordings", "team/run-1"


def misroute(tag: bytes, listener: Listener) -> Listener:
    """The second copy's connections reached the next broker over (a misrouting tunnel)."""
    if tag != b"wrong-00002" or listener.node_id is None:
        return listener
    return Listener(listener.node_id % 3 + 1, listener.advertised, listener.tunnel)


@pytest.fixture(scope="module")
def recording(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Two copies of the routed session, one misrouted, rotated into many small files (so
    calls are split across files, joined after listing the prefix)."""
    directory = tmp_path_factory.mktemp("s3")
    sample = read_sample(sorted(ROUTED.iterdir()))
    record_copies(directory, sample, [b"fine-000001", b"wrong-00002"], relisten=misroute,
                  rotate_bytes=48 * 1024)  # fmt: skip
    assert len(list(directory.iterdir())) > 3
    return directory


@pytest.fixture(scope="module")
def environment(s3_server: str, recording: Path) -> dict[str, str]:
    """The driver's environment: the usual AWS variables, the files put in the bucket."""
    import boto3

    env = {**os.environ, **S3_CREDENTIALS, "AWS_ENDPOINT_URL": s3_server,
           "AWS_REGION": "eu-west-1"}  # fmt: skip
    s3 = boto3.client("s3", endpoint_url=s3_server, region_name="eu-west-1",
                      aws_access_key_id=S3_CREDENTIALS["AWS_ACCESS_KEY_ID"],
                      aws_secret_access_key=S3_CREDENTIALS["AWS_SECRET_ACCESS_KEY"])  # fmt: skip
    s3.create_bucket(Bucket=BUCKET, CreateBucketConfiguration={"LocationConstraint": "eu-west-1"})
    for path in sorted(recording.iterdir()):
        s3.upload_file(str(path), BUCKET, f"{PREFIX}/{path.name}")
    return env


def without_sources(report: dict[str, object]) -> dict[str, object]:
    return {key: value for key, value in report.items() if key != "sources"}


def test_s3a_gives_the_verdicts_of_the_local_copies(
    spark_master: str, environment: dict[str, str], recording: Path, tmp_path: Path
) -> None:
    target = tmp_path / "report.json"
    out = subprocess.run(
        [sys.executable, "-m", "kafkatunnel", "verify", "--master", spark_master,
         f"s3a://{BUCKET}/{PREFIX}/", "--json", str(target)],
        capture_output=True, text=True, timeout=600, env=environment,
    )  # fmt: skip
    assert out.returncode == 1, out.stdout + out.stderr  # the misrouted copy fails the run
    remote = json.loads(target.read_text())
    local = verify_local([str(recording)]).as_dict()
    assert without_sources(remote) == without_sources(local)
    assert {g["verdict"] for g in remote["groups"]} >= {"ok", "misrouted"}
    assert len(remote["sources"]) == len(list(recording.iterdir()))
    assert all(s.startswith(f"s3a://{BUCKET}/{PREFIX}/") for s in remote["sources"])
    secret = S3_CREDENTIALS["AWS_SECRET_ACCESS_KEY"]
    assert secret not in out.stdout + out.stderr + target.read_text()


def test_what_keeps_object_storage_from_being_read_is_named(recording: Path) -> None:
    assert object_store_settings([str(recording)]) == {}
    with pytest.raises(ObjectStoreError, match="write s3a://b/p/"):
        object_store_settings(["s3://b/p/"])
    with pytest.raises(ObjectStoreError, match="AWS_ENDPOINT_URL='localhost:9000' is not"):
        object_store_settings(["s3a://b/p/"], {"AWS_ENDPOINT_URL": "localhost:9000"})
    settings = object_store_settings(["s3a://b/p/"], {"AWS_REGION": "eu-west-1"})
    assert settings["spark.jars.packages"].startswith("org.apache.hadoop:hadoop-aws:")
    assert not any("secret" in key or "access.key" in key for key in settings)
    out = subprocess.run(
        [sys.executable, "-m", "kafkatunnel", "verify", "--in-process", "s3a://b/p/"],
        capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert out.returncode == 2 and "drop --in-process" in out.stderr, out.stderr
    assert "Traceback" not in out.stderr
