"""Why a Spark job failed, as a cause and a fix: a missing bucket, absent or refused AWS
credentials, a class a setting names that is not there, a path with nothing at it, a master
that does not answer. Spark reports each as a Java exception wrapped in others (S3A's in
Hadoop's in Spark's, an executor's as text in the driver's), so every cause in the chain is
read, outermost first; the whole Java stack is for Spark's log, not for the user's terminal.
"""

from __future__ import annotations

import re
import socket
from collections.abc import Callable
from typing import Any, NamedTuple
from urllib.parse import urlparse

MASTER_TIMEOUT = 5.0  # seconds for a master's port to accept a connection


class SparkFailure(NamedTuple):
    """What went wrong and what to do about it. `known`: the cause is the user's to fix
    (when False, the job failed for a reason not recognised here, maybe a bug)."""

    cause: str
    fix: str
    known: bool = True


def spark_errors() -> tuple[type[BaseException], ...]:
    """The exceptions Spark raises in Python: a Java exception (Py4JJavaError), a lost JVM
    (Py4JError), or PySpark's own (the JVM did not start)."""
    from py4j.protocol import Py4JError
    from pyspark.errors import PySparkException

    return (Py4JError, PySparkException)


def java_causes(error: BaseException) -> list[str]:
    """'class: message' of the Java exception behind `error` and of each of its causes,
    outermost first; `error`'s own text when there is no Java exception to ask (or the JVM
    is gone)."""
    causes: list[str] = []
    # Py4JJavaError holds it as java_exception; PySpark's own conversions of some (an
    # IllegalArgumentException, for one) as _origin
    java: Any = getattr(error, "java_exception", None) or getattr(error, "_origin", None)
    try:
        while java is not None and len(causes) < 50:
            causes.append(f"{java.getClass().getName()}: {java.getMessage()}")
            cause = java.getCause()
            java = None if cause is None or cause.equals(java) else cause
    except Exception:  # the JVM went away: what its text says is all there is
        pass
    return causes or [str(error)]


MASTER_FIX = ("start it, or give --master the URL its log names ('Starting Spark master at "
              "spark://...'), or run on this machine: --master 'local[*]'")  # fmt: skip


def master_problem(master: str) -> SparkFailure | None:
    """Why a spark:// master cannot take the job (no address of it accepts a connection),
    or None. Spark itself would try to register for a minute before giving up."""
    if not master.startswith("spark://"):
        return None
    refusals = []
    for address in master.removeprefix("spark://").split(","):  # several: standby masters
        parsed = urlparse(f"spark://{address}")
        try:
            host, port = parsed.hostname, parsed.port or 7077
        except ValueError:
            host = None
        if not host:
            return SparkFailure(
                f"--master {master}: {address!r} is not HOST:PORT",
                "write spark://HOST:PORT, e.g. spark://spark-master:7077",
            )
        try:
            socket.create_connection((host, port), timeout=MASTER_TIMEOUT).close()
            return None
        except OSError as cause:
            reason = cause.strerror or str(cause) or type(cause).__name__
            refusals.append(f"{host}:{port}: {reason}")
    return SparkFailure(
        f"the Spark master at {master} does not answer ({'; '.join(refusals)})", MASTER_FIX
    )


CREDENTIALS_FIX = (
    "give the AWS SDK credentials: AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY, or "
    "AWS_PROFILE with ~/.aws/credentials (on a cluster, in each worker's environment too), "
    "or a provider in spark-defaults.conf (spark.hadoop.fs.s3a.aws.credentials.provider)"
)
_URI = re.compile(r"[a-z][a-z0-9+.-]*:/[^\s'`\"]+")


def _uri(text: str) -> str:
    """The first URI `text` names, without the punctuation that ends a sentence."""
    found = _URI.search(text)
    return found.group(0).rstrip(":;,.)") if found else "the object store"


def _bucket(text: str) -> str:
    uri = _uri(text)
    return uri.split("/")[2] if "://" in uri else uri


def _class(text: str) -> str:
    found = re.search(r"ClassNotFoundException: (?:Class )?([\w.$]+)", text)
    return found.group(1) if found else "a class"


def _setting(text: str) -> str:
    """Which setting named the class (S3A says which), as spark-defaults.conf spells it."""
    found = re.search(r"configuration key (fs\.[\w.-]+)", text)
    if found:
        return f"spark-defaults.conf sets spark.hadoop.{found.group(1)} to it"
    return "a setting names it (spark-defaults.conf, spark.jars or spark.hadoop.*)"


# (what the text holds, how to say it): the first rule that matches any cause wins, so
# the more precise come first (S3A wraps missing credentials in an AccessDeniedException).
Rule = tuple[re.Pattern[str], Callable[[str, str], tuple[str, str]]]
RULES: list[Rule] = [
    (re.compile(r"All masters are unresponsive"),
     lambda text, master: (f"the Spark master at {master} did not take the job (no "
                           "master answered)", MASTER_FIX)),
    (re.compile(r"NoSuchBucket|UnknownStoreException|bucket does not exist"),
     lambda text, master: (f"there is no bucket {_bucket(text)!r} ({_uri(text)})",
                           "check the bucket's name, and AWS_ENDPOINT_URL and AWS_REGION "
                           "for where it is; or create it")),
    (re.compile(r"NoAuthWithAWSException|Unable to load (AWS )?credentials"),
     lambda text, master: (f"no AWS credentials were found to read {_uri(text)}",
                           CREDENTIALS_FIX)),
    (re.compile(r"InvalidAccessKeyId|SignatureDoesNotMatch|ExpiredToken|InvalidToken"),
     lambda text, master: (f"the AWS credentials were refused reading {_uri(text)} "
                           "(unknown, wrong or expired)", CREDENTIALS_FIX)),
    (re.compile(r"AccessDenied|Access Denied|Status Code: 403|Forbidden"),
     lambda text, master: (f"access to {_uri(text)} was denied",
                           "use credentials allowed to list and read it (s3:ListBucket, "
                           "s3:GetObject), or check AWS_PROFILE and the bucket's policy")),
    (re.compile(r"ClassNotFoundException"),
     lambda text, master: (f"Spark could not load the class {_class(text)}",
                           f"{_setting(text)}: correct the name, or add its jar "
                           "(spark.jars.packages)")),
    (re.compile(r"Input path does not exist|matches 0 files"),
     lambda text, master: (f"there is nothing at {_uri(text)}",
                           "check the path (e.g. `aws s3 ls` or `hdfs dfs -ls` it)")),
    (re.compile(r"UnknownHostException|Connection refused|connect timed out"),
     lambda text, master: (f"could not connect to the store of {_uri(text)}",
                           "check AWS_ENDPOINT_URL (or the filesystem's address) and that "
                           "the service runs")),
]  # fmt: skip


def explain(causes: list[str], master: str) -> SparkFailure:
    """The failure that `causes` (java_causes') say, for a job on `master`."""
    if master.startswith("spark://") and any("stopped SparkContext" in c for c in causes):
        # Spark stops the context it is starting when no master takes the application
        causes = ["All masters are unresponsive", *causes]
    for pattern, say in RULES:
        for text in causes:
            if pattern.search(text):
                cause, fix = say(text, master)
                return SparkFailure(cause, fix)
    root = causes[-1].strip().splitlines()[0] if causes[-1].strip() else "(no message)"
    return SparkFailure(f"the Spark job failed: {root}",
                        "if nothing in Spark's log is yours to fix, report it as a "
                        "kafkatunnel bug with that log", known=False)  # fmt: skip
