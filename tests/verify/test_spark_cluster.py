"""verify on a real standalone Spark cluster on loopback: a master and a worker started from
the pyspark package's own bin/spark-class, the job submitted with --master spark://..."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from tests.verify.conftest import ROUTED


# A failing run on the cluster: tests/verify/test_object_storage.py (misrouted copies read
# from S3 there exit 1 with the verdicts of the local files).
@pytest.mark.parametrize(("path", "code"), [(ROUTED, 0)], ids=["ok"])
def test_verify_runs_on_a_standalone_cluster(
    spark_master: str, path: Path, code: int, tmp_path: Path
) -> None:
    out = subprocess.run(
        [sys.executable, "-m", "kafkatunnel", "verify", "--master", spark_master, str(path),
         "--json", str(tmp_path / "report.json")],
        capture_output=True, text=True, timeout=600,
    )  # fmt: skip
    assert out.returncode == code, out.stdout + out.stderr
    report = json.loads((tmp_path / "report.json").read_text())
    assert report["ok"] is (code == 0)
    assert report["files"] == (len(list(path.iterdir())) if path.is_dir() else 1)
    assert len([g for g in report["groups"] if g["kind"] == "group"]) == 6
    # Spark's own chatter is kept out of the report, in a log file the report names
    log = re.search(r"^Spark's own log: (\S+)$", out.stdout, re.M)
    assert log is not None, out.stdout
    assert Path(log.group(1)).is_file()
    for chatter in ("Using incubator modules", "Setting default log level", "NativeCodeLoader",
                    "log4j", "WARN "):  # fmt: skip
        assert chatter not in out.stdout + out.stderr, out.stdout + out.stderr


# spark-submit failing a run: test_spark_submit_strict_fails_a_capture_that_checks_nothing
@pytest.mark.parametrize(("path", "code"), [(ROUTED, 0)], ids=["ok"])
def test_verify_through_spark_submit(
    spark_master: str, path: Path, code: int, tmp_path: Path
) -> None:
    import pyspark

    from kafkatunnel.verify import submit
    from kafkatunnel.verify.job import package_archive

    spark_submit = Path(pyspark.__file__).parent / "bin" / "spark-submit"
    env = {**os.environ, "PYSPARK_PYTHON": sys.executable, "SPARK_LOCAL_IP": "127.0.0.1",
           "SPARK_HOME": str(Path(pyspark.__file__).parent)}  # fmt: skip
    out = subprocess.run(
        [str(spark_submit), "--master", spark_master, "--py-files", str(package_archive()),
         str(submit.__file__), str(path), "--json", str(tmp_path / "report.json")],
        capture_output=True, text=True, timeout=600, env=env,
    )  # fmt: skip
    assert out.returncode == code, out.stdout + out.stderr[-3000:]
    assert json.loads((tmp_path / "report.json").read_text())["ok"] is (code == 0)
    assert ("verify: ok" if code == 0 else "verify: FAILED") in out.stdout


def test_spark_submit_strict_fails_a_capture_that_checks_nothing(
    spark_master: str, tmp_path: Path
) -> None:
    """The CI gate as a spark-submit application: a capture whose only group cannot be
    checked (one JoinGroup, no FindCoordinator: deepflow's) passes without --strict and
    fails with it, saying why; with --json - standard output is the JSON alone (spark-submit
    merges the application's stderr into it, so the lines are not printed then)."""
    import pyspark

    from kafkatunnel.verify import submit
    from kafkatunnel.verify.job import package_archive

    capture = Path(__file__).parents[1] / "data" / "captures" / "deepflow" / "11-join-group-v7.pcap"
    spark_submit = Path(pyspark.__file__).parent / "bin" / "spark-submit"
    env = {**os.environ, "PYSPARK_PYTHON": sys.executable, "SPARK_LOCAL_IP": "127.0.0.1",
           "SPARK_HOME": str(Path(pyspark.__file__).parent)}  # fmt: skip
    base = [str(spark_submit), "--master", spark_master, "--py-files", str(package_archive()),
            str(submit.__file__), str(capture), "--json", "-"]  # fmt: skip
    out = subprocess.run(base, capture_output=True, text=True, timeout=600, env=env)
    assert out.returncode == 0, out.stdout + out.stderr[-3000:]
    report = json.loads(out.stdout)
    assert [g["verdict"] for g in report["groups"]] == ["unverified"]
    assert report["nothing_checked"].startswith("all 1 group(s) unverified")
    strict = subprocess.run([*base[:-2], "--strict"], capture_output=True, text=True,
                            timeout=600, env=env)  # fmt: skip
    assert strict.returncode == 1, strict.stdout + strict.stderr[-3000:]
    said = strict.stdout
    assert "strict: all 1 group(s) unverified" in said and "verify: FAILED" in said
