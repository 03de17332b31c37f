"""A Spark job that fails for a reason the user caused (a bucket that is not there, no AWS
credentials, a master that does not answer, a path with nothing at it, a class a setting
names) ends in one message naming the cause and the fix, exit status 2, and the Java stack
in Spark's log, never on the terminal. Through the command line against the local S3
server; the causes Spark reports alike everywhere are read from the one shared session."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from kafkatunnel.demo import free_port
from kafkatunnel.verify.failures import explain, java_causes, spark_errors
from tests.verify.conftest import ROUTED, S3_CREDENTIALS

BUCKET = "recordings-kept"  # exists; the other test module's bucket is its own


def verify(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    """The command line, its output in lines as long as they are (not laid out for COLUMNS)."""
    env = {k: v for k, v in (env or os.environ).items() if k not in ("COLUMNS", "TERMINAL_WIDTH")}
    return subprocess.run(
        [sys.executable, "-m", "kafkatunnel", "verify", *args],
        capture_output=True, text=True, timeout=600, env=env,
    )  # fmt: skip


def assert_said_plainly(out: subprocess.CompletedProcess[str], cause: str, fix: str) -> None:
    """Exit status 2, one cause and its fix on stderr, and no Java or Python stack."""
    assert out.returncode == 2, out.stdout + out.stderr
    lines = out.stderr.splitlines()
    assert len(lines) == 2, out.stderr
    assert lines[0] == f"error: {cause}", out.stderr
    assert lines[1].startswith("fix: ") and fix in lines[1], out.stderr
    for stack in ("Traceback", "Py4J", "\tat ", "    at ", "Caused by"):
        assert stack not in out.stdout + out.stderr, out.stdout + out.stderr


def java_stack_kept(out: subprocess.CompletedProcess[str], exception: str) -> str:
    """The Spark log the message names holds the whole Java stack: its text."""
    named = re.search(r"the whole Java stack is in (\S+)$", out.stderr, re.M)
    assert named is not None, out.stderr
    text = Path(named.group(1)).read_text()
    assert exception in text and "\tat org.apache." in text, text[-3000:]
    return text


def test_a_master_that_does_not_answer_is_said_before_spark_starts() -> None:
    """Nothing listens on the port: said at once (Spark would try to register for a minute
    and then fail on its stopped context)."""
    port = free_port()
    out = verify("--master", f"spark://127.0.0.1:{port}", str(ROUTED))
    assert_said_plainly(
        out,
        f"the Spark master at spark://127.0.0.1:{port} does not answer "
        f"(127.0.0.1:{port}: Connection refused)",
        "start it, or give --master the URL its log names",
    )
    out = verify("--master", "spark://127.0.0.1:x", str(ROUTED))  # a usage error, as flags'
    said = " ".join(out.stderr.split())
    assert out.returncode == 2, out.stdout + out.stderr
    assert "Invalid value for --master: 'spark://127.0.0.1:x': '127.0.0.1:x' is not " \
        "HOST:PORT" in said and "expected spark://HOST:PORT" in said, said  # fmt: skip
    assert "Traceback" not in out.stdout + out.stderr


@pytest.fixture(scope="module")
def s3_env(s3_server: str, tmp_path_factory: pytest.TempPathFactory) -> dict[str, str]:
    """The driver's environment for the local S3 server, which holds BUCKET: its endpoint
    and region, and no credentials anywhere the AWS SDK looks (no variables, no profile
    files, no instance)."""
    import boto3

    boto3.client("s3", endpoint_url=s3_server, region_name="eu-west-1",
                 aws_access_key_id=S3_CREDENTIALS["AWS_ACCESS_KEY_ID"],
                 aws_secret_access_key=S3_CREDENTIALS["AWS_SECRET_ACCESS_KEY"],
                 ).create_bucket(Bucket=BUCKET, CreateBucketConfiguration={
                     "LocationConstraint": "eu-west-1"})  # fmt: skip
    none = str(tmp_path_factory.mktemp("no-aws") / "none")
    env = {name: value for name, value in os.environ.items()
           if not name.startswith(("AWS_", "SPARK_"))}  # fmt: skip
    return env | {"AWS_ENDPOINT_URL": s3_server, "AWS_REGION": "eu-west-1",
                  "AWS_EC2_METADATA_DISABLED": "true", "AWS_SHARED_CREDENTIALS_FILE": none,
                  "AWS_CONFIG_FILE": none}  # fmt: skip


def test_a_bucket_that_is_not_there_is_named(s3_env: dict[str, str]) -> None:
    out = verify("--master", "local[1]", "s3a://no-such-bucket/run/", env=s3_env | S3_CREDENTIALS)
    assert_said_plainly(out, "there is no bucket 'no-such-bucket' (s3a://no-such-bucket/run)",
                        "check the bucket's name, and AWS_ENDPOINT_URL")  # fmt: skip
    java_stack_kept(out, "NoSuchBucket")


def test_missing_credentials_are_said_with_where_to_put_them(s3_env: dict[str, str]) -> None:
    out = verify("--master", "local[1]", f"s3a://{BUCKET}/run/", env=s3_env)
    assert_said_plainly(out, f"no AWS credentials were found to read s3a://{BUCKET}/run",
                        "AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY")  # fmt: skip
    java_stack_kept(out, "NoAuthWithAWSException")
    assert S3_CREDENTIALS["AWS_SECRET_ACCESS_KEY"] not in out.stdout + out.stderr


def failure_of(job: Any) -> BaseException:
    """What running `job` on Spark raised."""
    with pytest.raises(spark_errors()) as raised:
        job()
    return raised.value


def test_a_path_with_nothing_at_it_is_named(spark: Any, tmp_path: Path) -> None:
    """Hadoop says so alike for every filesystem (s3a:// as file:)."""
    missing = (tmp_path / "gone").as_uri()
    failure = failure_of(lambda: spark.sparkContext.binaryFiles(missing).collect())
    explained = explain(java_causes(failure), "local[2]")
    assert explained.known
    assert explained.cause == f"there is nothing at file:{tmp_path}/gone"


def test_a_class_a_setting_names_that_is_not_there_is_named(spark: Any) -> None:
    """As a credentials provider named in spark-defaults.conf that no jar holds."""
    key = "fs.kafkatunnel-missing.impl"
    hadoop = spark.sparkContext._jsc.hadoopConfiguration()
    hadoop.set(key, "com.example.MissingFileSystem")
    try:
        failure = failure_of(
            lambda: spark.sparkContext.binaryFiles("kafkatunnel-missing://x/y").collect()
        )
    finally:
        hadoop.unset(key)
    explained = explain(java_causes(failure), "local[2]")
    assert explained.known
    assert explained.cause == "Spark could not load the class com.example.MissingFileSystem"
    assert "add its jar" in explained.fix


def test_a_failure_not_recognised_names_its_root_cause(spark: Any) -> None:
    """Not the user's to fix as far as verify knows: its innermost cause, and exit 70."""
    failure = failure_of(lambda: spark.sparkContext._jvm.java.lang.Integer.parseInt("x"))
    explained = explain(java_causes(failure), "local[2]")
    assert not explained.known
    assert explained.cause == (
        'the Spark job failed: java.lang.NumberFormatException: For input string: "x"'
    )
