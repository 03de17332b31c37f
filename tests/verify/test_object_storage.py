"""`verify s3a://bucket/prefix/`: recordings read from a local S3 server (moto) through
Hadoop's S3A connector, the one matching PySpark's Hadoop, with the verdicts of the same
files read locally: on a standalone cluster with the virtualenv's PySpark (4), and in local
mode with PySpark 3.5, whose Hadoop 3.3 speaks AWS SDK v1 (scripts/_setup.sh installs it
beside the virtualenv). Credentials come from the environment (the driver's, and the cluster
workers' own), never from a flag, unless the user's spark-defaults.conf names a provider:
that one is kept. Local mode with PySpark 4 reads object storage in the docs tests
(docs/recording-and-verify.md, the gate with recordings in a bucket)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from kafkatunnel.capture.recorder import Listener
from kafkatunnel.verify.job import verify_local
from kafkatunnel.verify.objectstore import (
    PACKAGES,
    PROVIDER,
    SDK_V1_CHAIN,
    SDK_V2_CHAIN,
    ObjectStoreError,
    object_store_settings,
    spark_defaults,
)
from tests.verify.conftest import ROUTED, S3_CREDENTIALS
from tests.worlds.copies import read_sample, record_copies

BUCKET, PREFIX = "recordings", "team/run-1"
PINNED_35 = Path(__file__).resolve().parents[2] / "scripts" / "pyspark-3.5" / "requirements.txt"
PYSPARK_35 = PINNED_35.read_text().split("\npyspark==")[1].split()[0]  # what the set-up pins


def pyspark_35() -> Path:
    """Where scripts/_setup.sh installed PySpark 3.5 (a directory for PYTHONPATH)."""
    configured = os.environ.get("KT_PYSPARK35")
    where = Path(configured or Path.home() / ".cache/kafkatunnel" / f"pyspark-{PYSPARK_35}")
    assert (where / "pyspark" / "jars").is_dir(), (
        f"PySpark {PYSPARK_35} is not in {where}: scripts/test installs it "
        "(kt_pyspark35 in scripts/_setup.sh), or set KT_PYSPARK35"
    )
    return where


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


def verify_bucket(
    master: str, env: dict[str, str], target: Path
) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "kafkatunnel", "verify", "--master", master,
         f"s3a://{BUCKET}/{PREFIX}/", "--json", str(target)],
        capture_output=True, text=True, timeout=600, env=env,
    )  # fmt: skip


def assert_local_verdicts(
    out: subprocess.CompletedProcess[str], target: Path, recording: Path
) -> None:
    """verify read the bucket and judged as it judges the files read locally."""
    assert out.returncode == 1, out.stdout + out.stderr  # the misrouted copy fails the run
    remote = json.loads(target.read_text())
    local = verify_local([str(recording)]).as_dict()
    assert without_sources(remote) == without_sources(local)
    assert {g["verdict"] for g in remote["groups"]} >= {"ok", "misrouted"}
    assert len(remote["sources"]) == len(list(recording.iterdir()))
    assert all(s.startswith(f"s3a://{BUCKET}/{PREFIX}/") for s in remote["sources"])


def test_s3a_gives_the_verdicts_of_the_local_copies(
    spark_master: str, environment: dict[str, str], recording: Path, tmp_path: Path
) -> None:
    target = tmp_path / "report.json"
    out = verify_bucket(spark_master, environment, target)
    assert_local_verdicts(out, target, recording)
    secret = S3_CREDENTIALS["AWS_SECRET_ACCESS_KEY"]
    assert secret not in out.stdout + out.stderr + target.read_text()


def test_s3a_on_pyspark_3_5_gives_the_verdicts_of_the_local_copies(
    environment: dict[str, str], recording: Path, tmp_path: Path
) -> None:
    """PySpark 3.5 carries Hadoop 3.3.4, whose S3A connector speaks AWS SDK v1: verify asks
    for hadoop-aws 3.3.4 and the SDK v1 default chain (v2's class is not on its class
    path). One JVM, in local mode."""
    env = {**environment, "PYTHONPATH": os.pathsep.join(
        [str(pyspark_35()), *filter(None, [environment.get("PYTHONPATH")])])}  # fmt: skip
    for variable in ("SPARK_HOME", "SPARK_CONF_DIR"):
        env.pop(variable, None)
    version = subprocess.run(
        [sys.executable, "-c", "import pyspark; print(pyspark.__version__)"],
        capture_output=True, text=True, timeout=60, env=env, check=True,
    ).stdout.strip()  # fmt: skip
    assert version == PYSPARK_35
    target = tmp_path / "report.json"
    out = verify_bucket("local[2]", env, target)
    assert_local_verdicts(out, target, recording)


def test_a_provider_set_in_spark_defaults_is_kept(
    environment: dict[str, str], recording: Path, tmp_path: Path
) -> None:
    """The user's spark-defaults.conf names the provider, S3A's own that reads the keys set
    there too; the environment holds no credentials for the SDK's default chain to find (no
    AWS variables, no profile files, no instance). verify keeps that provider, and reads."""
    conf = tmp_path / "conf"
    conf.mkdir()
    (conf / "spark-defaults.conf").write_text(
        "# the team's own settings\n"
        f"{PROVIDER}  org.apache.hadoop.fs.s3a.SimpleAWSCredentialsProvider\n"
        f"spark.hadoop.fs.s3a.access.key {S3_CREDENTIALS['AWS_ACCESS_KEY_ID']}\n"
        f"spark.hadoop.fs.s3a.secret.key={S3_CREDENTIALS['AWS_SECRET_ACCESS_KEY']}\n"
    )
    env = {name: value for name, value in environment.items() if name not in S3_CREDENTIALS}
    env |= {"SPARK_CONF_DIR": str(conf), "AWS_EC2_METADATA_DISABLED": "true",
            "AWS_SHARED_CREDENTIALS_FILE": str(tmp_path / "none"),
            "AWS_CONFIG_FILE": str(tmp_path / "none")}  # fmt: skip
    env.pop("AWS_PROFILE", None)
    target = tmp_path / "report.json"
    assert_local_verdicts(verify_bucket("local[2]", env, target), target, recording)


def test_what_keeps_object_storage_from_being_read_is_named(recording: Path) -> None:
    assert object_store_settings([str(recording)]) == {}
    with pytest.raises(ObjectStoreError, match="write s3a://b/p/"):
        object_store_settings(["s3://b/p/"])
    with pytest.raises(ObjectStoreError, match="AWS_ENDPOINT_URL='localhost:9000' is not"):
        object_store_settings(["s3a://b/p/"], {"AWS_ENDPOINT_URL": "localhost:9000"})
    settings = object_store_settings(["s3a://b/p/"], {"AWS_REGION": "eu-west-1"})
    assert settings[PACKAGES].startswith("org.apache.hadoop:hadoop-aws:")
    assert settings[PROVIDER] in (SDK_V1_CHAIN, SDK_V2_CHAIN)
    assert not any("secret" in key or "access.key" in key for key in settings)
    out = subprocess.run(
        [sys.executable, "-m", "kafkatunnel", "verify", "--in-process", "s3a://b/p/"],
        capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert out.returncode == 2 and "drop --in-process" in out.stderr, out.stderr
    assert "Traceback" not in out.stderr


def test_what_the_user_set_in_spark_defaults_is_kept(tmp_path: Path) -> None:
    """Settings verify passes replace spark-defaults.conf's: a provider there is not passed,
    packages there are passed along with hadoop-aws, and hadoop-aws there is theirs."""
    (tmp_path / "spark-defaults.conf").write_text(
        "# comment\n! comment\n\n"
        f"{PROVIDER}   com.example.TeamCredentials \n"
        f"{PACKAGES}=org.example:thing:1.0\n"
        "spark.executor.memory: 2g\n"
    )
    defaults = spark_defaults({"SPARK_CONF_DIR": str(tmp_path)})
    assert defaults == {
        PROVIDER: "com.example.TeamCredentials",
        PACKAGES: "org.example:thing:1.0",
        "spark.executor.memory": "2g",
    }
    settings = object_store_settings(["s3a://b/p/"], {}, defaults)
    assert PROVIDER not in settings
    thing, aws = settings[PACKAGES].split(",")
    assert thing == "org.example:thing:1.0" and aws.startswith("org.apache.hadoop:hadoop-aws:")
    theirs = {PACKAGES: "org.apache.hadoop:hadoop-aws:3.3.6"}
    assert PACKAGES not in object_store_settings(["s3a://b/p/"], {}, theirs)
    assert spark_defaults({"SPARK_CONF_DIR": str(tmp_path / "none")}) == {}
