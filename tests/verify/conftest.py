"""Recordings and captures committed under tests/data; a standalone Spark cluster and a
local S3 server for the tests that read recordings from them."""

from __future__ import annotations

import os
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from kafkatunnel.demo import free_port
from kafkatunnel.demo.apache import JIT
from kafkatunnel.demo.processes import ManagedProcess

DATA = Path(__file__).resolve().parent.parent / "data"
ROUTED = DATA / "recordings" / "routed"
SINGLE_FORWARD = DATA / "recordings" / "single-forward.pcapng"
GROUP_KINDS = DATA / "recordings" / "group-kinds"  # scripts/record_group_kinds.py
CAPTURES = DATA / "captures"

# Credentials for the local S3 server (it accepts any): what a cluster's environment holds
S3_CREDENTIALS = {"AWS_ACCESS_KEY_ID": "kafkatunnel-test", "AWS_SECRET_ACCESS_KEY": "not-a-secret"}


@pytest.fixture(scope="package")
def spark_master() -> Iterator[str]:
    """A standalone Spark master and worker on loopback, from the pyspark package's own
    bin/spark-class. The worker's environment holds the local S3 server's credentials, as
    a real cluster's workers hold theirs (its executors read them, never a setting)."""
    import pyspark

    home = Path(pyspark.__file__).parent
    env = {**os.environ, "SPARK_HOME": str(home), "PYSPARK_PYTHON": sys.executable,
           "SPARK_LOCAL_IP": "127.0.0.1", "SPARK_DAEMON_JAVA_OPTS": JIT,
           **S3_CREDENTIALS}  # fmt: skip
    spark_class = str(home / "bin" / "spark-class")
    port = free_port()
    master = ManagedProcess(
        [spark_class, "org.apache.spark.deploy.master.Master", "--host", "127.0.0.1",
         "--port", str(port), "--webui-port", str(free_port())],
        name="spark-master", env=env,
    )  # fmt: skip
    worker = None
    try:
        master.wait_for_line(r"I have been elected leader", timeout=90)
        url = f"spark://127.0.0.1:{port}"
        worker = ManagedProcess(
            [spark_class, "org.apache.spark.deploy.worker.Worker", "--host", "127.0.0.1",
             "--webui-port", str(free_port()), "--cores", "2", "--memory", "1g", url],
            name="spark-worker", env=env,
        )  # fmt: skip
        worker.wait_for_line(r"Successfully registered with master", timeout=90)
        yield url
    finally:
        if worker is not None:
            worker.stop()
        master.stop()


@pytest.fixture(scope="package")
def s3_server() -> Iterator[str]:
    """moto's S3 server on loopback: its endpoint URL."""
    from moto.server import ThreadedMotoServer

    server = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    server.start()
    host, port = server.get_host_and_port()
    yield f"http://{host}:{port}"
    server.stop()
