"""Recordings in object storage: `s3a://bucket/prefix/` read through Hadoop's S3A connector.

The connector (hadoop-aws) must match the Hadoop inside the installed PySpark, so its
version is read from PySpark's own jars and Spark resolves it as `--packages` does (the
local Maven repository first, then Maven Central). The endpoint and region come from the
AWS SDKs' usual variables. Credentials never pass through here: the AWS SDK's default
chain finds them on the driver and on each executor (AWS_ACCESS_KEY_ID and friends,
~/.aws/credentials and AWS_PROFILE, web identity, the instance's role).
"""

from __future__ import annotations

import os
import re
from collections.abc import Iterable, Mapping
from pathlib import Path
from urllib.parse import urlparse

HADOOP_AWS = "org.apache.hadoop:hadoop-aws"
S3A = "s3a://"
CREDENTIALS_CHAIN = "software.amazon.awssdk.auth.credentials.DefaultCredentialsProvider"


class ObjectStoreError(ValueError):
    """A setting that keeps recordings in object storage from being read, and its fix."""


def is_object_store(path: str) -> bool:
    return path.startswith(S3A)


def _pyspark_jars() -> Path | None:
    import importlib.util

    spec = importlib.util.find_spec("pyspark")
    return Path(spec.origin).parent / "jars" if spec is not None and spec.origin else None


def hadoop_version() -> str | None:
    """The Hadoop version PySpark ships (from its hadoop-client-api jar), or None."""
    for jar in (_pyspark_jars() or Path("/nonexistent")).glob("hadoop-client-api-*.jar"):
        found = re.fullmatch(r"hadoop-client-api-(\d+\.\d+\.\d+)\.jar", jar.name)
        if found:
            return found.group(1)
    return None


def object_store_settings(
    paths: Iterable[str], env: Mapping[str, str] = os.environ
) -> dict[str, str]:
    """Spark settings to read the s3a:// paths among `paths` ({} when there are none)."""
    paths = list(paths)
    wrong = [p for p in paths if p.startswith(("s3://", "s3n://"))]
    if wrong:
        raise ObjectStoreError(f"{wrong[0]}: Hadoop reads S3 as s3a://, write "
                               f"{'s3a://' + wrong[0].split('://', 1)[1]}")  # fmt: skip
    if not any(is_object_store(p) for p in paths):
        return {}
    settings = {"spark.hadoop.fs.s3a.aws.credentials.provider": CREDENTIALS_CHAIN}
    jars = _pyspark_jars()
    if jars is None or not any(jars.glob("hadoop-aws-*.jar")):  # else the user added it
        version = hadoop_version()
        if version is None:
            raise ObjectStoreError("s3a:// needs PySpark (pip install 'kafkatunnel[verify]')")
        settings["spark.jars.packages"] = f"{HADOOP_AWS}:{version}"
    endpoint = env.get("AWS_ENDPOINT_URL_S3") or env.get("AWS_ENDPOINT_URL")
    if endpoint:
        parsed = urlparse(endpoint)
        if parsed.scheme not in ("http", "https") or not parsed.hostname:
            raise ObjectStoreError(
                f"AWS_ENDPOINT_URL{'_S3' if env.get('AWS_ENDPOINT_URL_S3') else ''}="
                f"{endpoint!r} is not an http:// or https:// URL: set it to the S3 "
                "server's URL, e.g. http://127.0.0.1:9000"
            )
        settings["spark.hadoop.fs.s3a.endpoint"] = endpoint
        settings["spark.hadoop.fs.s3a.path.style.access"] = "true"  # MinIO, Ceph, moto...
    region = env.get("AWS_REGION") or env.get("AWS_DEFAULT_REGION")
    if region:
        settings["spark.hadoop.fs.s3a.endpoint.region"] = region
    return settings
