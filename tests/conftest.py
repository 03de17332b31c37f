"""Shared fixtures: one isolated local cluster for the session, torn down even on failure."""

from __future__ import annotations

import compileall
import json
import logging
import os
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import hypothesis
import pytest

from kafkatunnel.demo import LocalCluster, isolation_problem
from kafkatunnel.demo.apache import JIT
from kafkatunnel.demo.netns import list_harness_namespaces
from kafkatunnel.demo.processes import UNOBSERVED, unobserved_task_errors
from tests.worlds.private_mounts import present

pytest_plugins = ["tests.scheduling"]

# Spark's drivers (the `spark` session, every `kafkatunnel verify` the tests run) with the
# client compiler only, as the test brokers: a third less CPU for the same verdicts
# (scripts/bench_test_jvms.py). A user's own SPARK_SUBMIT_OPTS is kept.
os.environ.setdefault("SPARK_SUBMIT_OPTS", JIT)

# kio's types register hypothesis strategies when hypothesis is installed (as here), and
# the first registration builds hypothesis' Unicode table, cached in .hypothesis under the
# working directory: 1.1 s of CPU in each process the tests start in a fresh tmp_path (a
# `kafkatunnel` command, a verify worker, a Spark executor's Python). One cache for them all.
ROOT = Path(__file__).resolve().parents[1]
os.environ.setdefault("HYPOTHESIS_STORAGE_DIRECTORY", str(ROOT / ".hypothesis"))

# Properties are judged by what they find, not by how fast an example runs: beside JVMs and
# brokers on two cores, an example or its generation may wait seconds for a CPU, which
# hypothesis' deadline (200 ms) and its too_slow health check would report as a failure.
hypothesis.settings.register_profile(
    "suite", deadline=None, suppress_health_check=[hypothesis.HealthCheck.too_slow]
)
hypothesis.settings.load_profile("suite")

# `up` under sudo runs as the invoking user: tests say themselves when they play sudo.
for _variable in ("SUDO_UID", "SUDO_GID", "SUDO_USER", "SUDO_COMMAND"):
    os.environ.pop(_variable, None)


def pytest_configure(config: pytest.Config) -> None:
    """The run's controller (or a run without workers) compiles kafkatunnel once: the tests
    start hundreds of `kafkatunnel` processes, and where PYTHONDONTWRITEBYTECODE is set
    (or the tree is fresh) each would compile every module it imports again, 0.17 s of CPU
    each. The files are Python's own __pycache__, ignored by git, checked against the source
    on every import."""
    if not hasattr(config, "workerinput"):
        compileall.compile_dir(ROOT / "kafkatunnel", quiet=1)
        # before any world starts (the workers inherit it): see machine_paths_before
        os.environ[MACHINE_PATHS_VARIABLE] = json.dumps(sorted(map(str, present())))


MACHINE_PATHS_VARIABLE = "KT_TESTS_MACHINE_PATHS_BEFORE"


@pytest.fixture(scope="session")
def machine_paths_before() -> set[Path]:
    """Which machine-wide paths a kubelet or containerd writes (/var/lib/kubelet, ...) the
    machine had before the suite started: none other may exist after a test world ran."""
    return {Path(p) for p in json.loads(os.environ[MACHINE_PATHS_VARIABLE])}


@pytest.fixture(scope="session", autouse=True)
def no_machine_wide_paths_left(machine_paths_before: set[Path]) -> Iterator[None]:
    """After this worker's tests (the Kubernetes and Docker worlds among them), none of
    those paths exists that the machine did not have before the suite."""
    yield
    made = sorted(map(str, present() - machine_paths_before))
    assert not made, f"the test worlds left machine-wide paths behind: {made}"


class _UnobservedHere(logging.Handler):
    """asyncio's "never retrieved" records of this process (a tunnel the test runs on a
    thread of its own, see kafkatunnel/tunnel/background.py)."""

    def __init__(self) -> None:
        super().__init__(logging.ERROR)
        self.seen: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        if UNOBSERVED in record.getMessage():
            self.seen.append(self.format(record))

    def told(self) -> list[str]:
        seen, self.seen = self.seen, []
        return [f"this process:\n{text}" for text in seen]


_UNOBSERVED_HERE = _UnobservedHere()
logging.getLogger("asyncio").addHandler(_UNOBSERVED_HERE)


@pytest.fixture(autouse=True)
def no_task_dies_unobserved() -> Iterator[None]:
    """Any of our programs the test ran (an `up`, a world's tunnel) that printed asyncio's
    "Task exception was never retrieved" fails the test: a task of the tunnel ended with an
    error nobody saw, whatever else the test checked (a shared world's, printed while no
    test ran, fails the next one)."""
    yield
    told = unobserved_task_errors() + _UNOBSERVED_HERE.told()
    if told:
        pytest.fail("a task died unobserved:\n" + "\n\n".join(told), pytrace=False)


@pytest.fixture(scope="session")
def cluster() -> Iterator[LocalCluster]:
    """The isolated cluster: 3 mock brokers and a tansu broker in a network namespace."""
    problem = isolation_problem()
    if problem:
        pytest.skip(f"needs network isolation, which is unavailable: {problem}")
    with LocalCluster(isolate=True) as local:
        yield local


@pytest.fixture(scope="session")
def spark() -> Iterator[Any]:
    """One local Spark session (its JVM takes seconds to start) for every test that needs it."""
    from kafkatunnel.verify.job import spark_session

    session = spark_session("local[2]")
    yield session
    session.stop()


# A skipped test shows nothing: a run that skips must say so, and fails unless asked to
# accept it (KT_TESTS_ACCEPT_SKIPS=1), e.g. without root, where isolation is unavailable.
ACCEPT_SKIPS = "KT_TESTS_ACCEPT_SKIPS"
_skips: Counter[str] = Counter()


def pytest_runtest_logreport(report: pytest.TestReport) -> None:
    if report.skipped and not hasattr(report, "wasxfail"):
        reason = report.longrepr[2] if isinstance(report.longrepr, tuple) else str(report.longrepr)
        _skips[reason.removeprefix("Skipped: ")] += 1


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    """Fail the run if tests were skipped (unless accepted), or if the harness left a
    namespace of this process or of its workers behind."""
    if _skips:
        lines = [f"  {count:4d} x {reason}" for reason, count in _skips.most_common()]
        print(f"\n{sum(_skips.values())} test(s) SKIPPED:", *lines, sep="\n")
        if os.environ.get(ACCEPT_SKIPS) != "1":
            print(f"a run that skips tests fails: fix what they need, or set {ACCEPT_SKIPS}=1")
            session.exitstatus = pytest.ExitCode.TESTS_FAILED
    if isolation_problem():
        return
    from tests.scheduling import run_pids  # here: imported first as the plugin, rewritten

    pids = run_pids(session.config)
    mine = [n for n in list_harness_namespaces() if any(n.startswith(f"kt-{p}-") for p in pids)]
    if mine:
        print(f"\nleft behind by the test harness: network namespaces {mine}")
        session.exitstatus = pytest.ExitCode.TESTS_FAILED
