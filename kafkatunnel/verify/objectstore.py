"""Recordings in object storage: `s3a://bucket/prefix/` read through Hadoop's S3A connector.

The connector (hadoop-aws) must match the Hadoop inside the installed PySpark, so its
version is read from PySpark's own jars and Spark resolves it as `--packages` does (the
local Maven repository first, then Maven Central). The endpoint and region come from the
AWS SDKs' usual variables. Credentials never pass through here: the AWS SDK's default
chain finds them on the driver and on each executor (AWS_ACCESS_KEY_ID and friends,
~/.aws/credentials and AWS_PROFILE, web identity, the instance's role). That chain is a
class of the SDK the Hadoop speaks: v1 up to Hadoop 3.3 (PySpark 3.5), v2 from Hadoop 3.4
(PySpark 4). A provider or packages the user set in spark-defaults.conf are kept: settings
made here would replace them.
"""

from __future__ import annotations

import os
import re
from collections.abc import Iterable, Mapping
from pathlib import Path
from urllib.parse import urlparse

HADOOP_AWS = "org.apache.hadoop:hadoop-aws"
S3A = "s3a://"
PROVIDER = "spark.hadoop.fs.s3a.aws.credentials.provider"
PACKAGES = "spark.jars.packages"
SDK_V1_CHAIN = "com.amazonaws.auth.DefaultAWSCredentialsProviderChain"
SDK_V2_CHAIN = "software.amazon.awssdk.auth.credentials.DefaultCredentialsProvider"
SDK_V2_HADOOP = (3, 4)  # the first Hadoop whose S3A connector speaks AWS SDK v2


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


def credentials_chain(hadoop: str) -> str:
    """The AWS SDK's default credentials chain, as a class of the SDK `hadoop` speaks."""
    release = tuple(int(part) for part in hadoop.split(".")[:2])
    return SDK_V2_CHAIN if release >= SDK_V2_HADOOP else SDK_V1_CHAIN


def spark_defaults(env: Mapping[str, str] = os.environ) -> dict[str, str]:
    """The settings in the spark-defaults.conf Spark reads: $SPARK_CONF_DIR's, else the conf
    directory of $SPARK_HOME or of the installed PySpark ({} when there is none)."""
    if env.get("SPARK_CONF_DIR"):
        conf = Path(env["SPARK_CONF_DIR"])
    elif env.get("SPARK_HOME"):
        conf = Path(env["SPARK_HOME"]) / "conf"
    else:
        jars = _pyspark_jars()
        if jars is None:
            return {}
        conf = jars.parent / "conf"
    try:
        text = (conf / "spark-defaults.conf").read_text(errors="replace")
    except OSError:
        return {}
    settings = {}
    for line in text.splitlines():
        found = re.match(r"\s*([^#!=:\s][^=:\s]*)[ \t\f]*[=:]?[ \t\f]*(.*)", line)
        if found:
            settings[found.group(1)] = found.group(2).strip()
    return settings


def object_store_settings(
    paths: Iterable[str],
    env: Mapping[str, str] = os.environ,
    defaults: Mapping[str, str] | None = None,
) -> dict[str, str]:
    """Spark settings to read the s3a:// paths among `paths` ({} when there are none).
    `defaults`: the user's spark-defaults.conf settings (read where Spark reads them)."""
    paths = list(paths)
    wrong = [p for p in paths if p.startswith(("s3://", "s3n://"))]
    if wrong:
        raise ObjectStoreError(f"{wrong[0]}: Hadoop reads S3 as s3a://, write "
                               f"{'s3a://' + wrong[0].split('://', 1)[1]}")  # fmt: skip
    if not any(is_object_store(p) for p in paths):
        return {}
    user = spark_defaults(env) if defaults is None else defaults
    version = hadoop_version()
    settings = {}
    if PROVIDER not in user and version is not None:
        settings[PROVIDER] = credentials_chain(version)
    jars = _pyspark_jars()
    theirs = user.get(PACKAGES, "")
    if (jars is None or not any(jars.glob("hadoop-aws-*.jar"))) and f"{HADOOP_AWS}:" not in theirs:
        if version is None:
            raise ObjectStoreError("s3a:// needs PySpark (pip install 'kafkatunnel[verify]')")
        settings[PACKAGES] = ",".join(filter(None, [theirs, f"{HADOOP_AWS}:{version}"]))
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
