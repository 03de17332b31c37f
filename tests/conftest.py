"""Shared fixtures: one isolated local cluster for the session, torn down even on failure."""

from __future__ import annotations

import os
from collections.abc import Iterator
from typing import Any

import pytest

from kafkatunnel.localcluster import LocalCluster, isolation_problem
from kafkatunnel.localcluster.netns import list_harness_namespaces

# `up` under sudo runs as the invoking user: tests say themselves when they play sudo.
for _variable in ("SUDO_UID", "SUDO_GID", "SUDO_USER", "SUDO_COMMAND"):
    os.environ.pop(_variable, None)


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


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    """Fail the run if the harness left a namespace of this process behind."""
    if isolation_problem():
        return
    mine = [n for n in list_harness_namespaces() if n.startswith(f"kt-{os.getpid()}-")]
    if mine:
        print(f"\nleft behind by the test harness: network namespaces {mine}")
        session.exitstatus = pytest.ExitCode.TESTS_FAILED
