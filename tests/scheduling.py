"""How the suite runs side by side (pytest-xdist, `--dist loadgroup`).

Tests that share a world wider than one test (a module's or a package's fixture, or a
Spark session) go to one worker together, so that world starts once per run. Tests marked
`alone` change something of the whole machine or measure time: they run while no other
test runs, and other tests wait meanwhile. Everything else runs on any worker, each
with its own mock cluster in its own network namespace."""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import shutil
import tempfile
import time
from collections.abc import Generator, Iterator
from pathlib import Path

import pytest

from kafkatunnel.demo.ports import below_ephemeral_slice, pick_from

# Session-scoped worlds that are worth a worker of their own: a JVM. The other session
# fixtures are cheap (the mock cluster starts in a second or two): each worker has its own.
SHARED_SESSION_WORLDS = frozenset({"spark"})
WIDER_THAN_A_TEST = frozenset({"class", "module", "package"})
# What a `quick` test may not use: a cluster, a JVM, an engine, an API server
WORLDS = frozenset({"cluster", "apache_kafka", "apache_kafka_3", "docker", "spark",
                    "spark_master", "s3_server", "world", "apiserver", "make_tunnel",
                    "kubernetes", "strimzi_kafka"})  # fmt: skip
LOCKS = "KT_TEST_LOCKS"  # the run's lock directory, made by the controller
TERMINAL = "KT_TEST_TERMINAL"  # the controller's COLUMNS and LINES, for its workers
STATE = "KAFKATUNNEL_STATE_DIR"  # where `up --detach`, `status` and `down` meet


def world_groups(items: list[pytest.Item]) -> dict[str, str]:
    """nodeid -> group, for tests that share a world: tests joined by one, directly or
    through each other, form one group."""
    parent: dict[str, str] = {}

    def root(key: str) -> str:
        while parent.setdefault(key, key) != key:
            parent[key] = parent[parent[key]]
            key = parent[key]
        return key

    worlds: dict[str, list[str]] = {}
    for item in items:
        info = getattr(item, "_fixtureinfo", None)
        if info is None:
            continue
        keys = [
            f"{definition.baseid or '.'}::{name}"
            for name in info.names_closure
            # the definition that serves the test: one a module overrides is not set up
            for definition in info.name2fixturedefs.get(name, ())[-1:]
            if definition.scope in WIDER_THAN_A_TEST or name in SHARED_SESSION_WORLDS
        ]
        if keys:
            worlds[item.nodeid] = keys
            for key in keys[1:]:
                parent[root(key)] = root(keys[0])
    return {nodeid: root(keys[0]) for nodeid, keys in worlds.items()}


@pytest.hookimpl(tryfirst=True)  # before xdist reads the groups into the node ids
def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Refuse a `quick` mark on a test that is not; put each test in its world's group, and
    the tests marked `alone` in one group of their own."""
    heavy = [
        f"{item.nodeid} uses {sorted(used)}"
        for item in items
        if item.get_closest_marker("quick")
        and (used := WORLDS & set(getattr(item, "fixturenames", ())))
    ]
    if heavy:
        raise pytest.UsageError("tests marked quick that are not:\n" + "\n".join(heavy))
    groups = world_groups(items)
    for item in items:
        group = groups.get(item.nodeid, "alone" if _alone(item) else None)
        if group is not None and item.get_closest_marker("xdist_group") is None:
            item.add_marker(pytest.mark.xdist_group(group))


_made: list[str] = []  # directories this process made, removed at its end


def pytest_configure(config: pytest.Config) -> None:
    """The controller of a parallel run makes the lock directory its workers inherit. Each
    worker (or a run without workers) keeps the tunnels it starts in a state directory of
    its own, so `status` and `down` in one test never meet another worker's tunnel, nor the
    user's own."""
    config.pluginmanager.register(_Turns(), "kafkatunnel-turns")
    if hasattr(config, "workerinput"):
        # a worker starts with COLUMNS=80 and LINES=24, which the run never had: the
        # commands under test would lay out their messages for an 80-column terminal
        for variable, value in json.loads(os.environ.get(TERMINAL, "{}")).items():
            if value is None:
                os.environ.pop(variable, None)
    if hasattr(config, "workerinput") or not config.getoption("numprocesses", None):
        if STATE not in os.environ:
            os.environ[STATE] = tempfile.mkdtemp(prefix="kt-state-")
            _made.append(os.environ[STATE])
    else:
        os.environ[TERMINAL] = json.dumps({v: os.environ.get(v) for v in ("COLUMNS", "LINES")})
    if LOCKS not in os.environ and config.getoption("numprocesses", None):
        os.environ[LOCKS] = tempfile.mkdtemp(prefix="kafkatunnel-tests-")
        _made.append(os.environ[LOCKS])
    if hasattr(config, "workerinput") and LOCKS in os.environ:
        (Path(os.environ[LOCKS]) / f"worker-{os.getpid()}").touch()
    if hasattr(config, "workerinput"):  # ports a worker picks: none another worker picks
        worker = config.workerinput
        index = int(str(worker["workerid"]).removeprefix("gw"))
        pick_from(below_ephemeral_slice(index, int(worker["workercount"])))


def run_pids(config: pytest.Config) -> list[int]:
    """This process's pid and, in a parallel run's controller (which runs no test), its
    workers': the harness names its namespaces by pid."""
    where = os.environ.get(LOCKS)
    if hasattr(config, "workerinput") or where is None:
        return [os.getpid()]
    return [
        os.getpid(),
        *(int(p.name.removeprefix("worker-")) for p in Path(where).glob("worker-*")),
    ]


def pytest_unconfigure(config: pytest.Config) -> None:
    for made in _made:
        shutil.rmtree(made, ignore_errors=True)


@contextlib.contextmanager
def _locked(path: Path, mode: int) -> Iterator[None]:
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o600)
    try:
        fcntl.flock(fd, mode)
        yield
    finally:
        os.close(fd)  # releases the lock


@contextlib.contextmanager
def turn(alone: bool) -> Iterator[None]:
    """A readers-writer lock over the run's workers: a test alone holds it exclusively;
    others share it. The turnstile makes a waiting `alone` test stop new tests from
    starting, so it is not starved by a stream of shared holders."""
    where = os.environ.get(LOCKS)
    if where is None:  # one test after another
        yield
        return
    turnstile, lock = Path(where) / "turnstile", Path(where) / "lock"
    if alone:
        with _locked(turnstile, fcntl.LOCK_EX), _locked(lock, fcntl.LOCK_EX):
            yield
        return
    with _locked(turnstile, fcntl.LOCK_EX):
        fd = os.open(lock, os.O_RDWR | os.O_CREAT, 0o600)
        fcntl.flock(fd, fcntl.LOCK_SH)
    try:
        yield
    finally:
        os.close(fd)


def _alone(item: pytest.Item | None) -> bool:
    return item is not None and item.get_closest_marker("alone") is not None


class _Turns:
    """The turn of this worker's tests. Tests marked `alone` are one group, run one after
    another: the exclusive turn is taken once for them all and given back after the last,
    so the other workers drain once, not before each."""

    def __init__(self) -> None:
        self.held: contextlib.ExitStack | None = None

    @pytest.hookimpl(wrapper=True)
    def pytest_runtest_protocol(
        self, item: pytest.Item, nextitem: pytest.Item | None
    ) -> Generator[None, object, object]:
        """Each test's set-up, call and tear-down (where shared worlds start and stop)."""
        with _timed(item):
            if not _alone(item):
                with turn(alone=False):
                    return (yield)
            if self.held is None:
                self.held = contextlib.ExitStack()
                self.held.enter_context(turn(alone=True))
            try:
                return (yield)
            finally:
                if not _alone(nextitem):
                    self.held.close()
                    self.held = None


TIMELINE = "KT_TESTS_TIMELINE"  # a file: each test's worker, start, end and group, as JSON lines


@contextlib.contextmanager
def _timed(item: pytest.Item) -> Iterator[None]:
    """With KT_TESTS_TIMELINE set, a line per test (its wait for its turn, set-up, call and
    tear-down): what the run's slowest worker spent its time on, for making the run shorter."""
    where = os.environ.get(TIMELINE)
    started = time.time()
    try:
        yield
    finally:
        if where:
            marker = item.get_closest_marker("xdist_group")
            line = {"worker": os.environ.get("PYTEST_XDIST_WORKER", "main"),
                    "test": item.nodeid, "start": started, "end": time.time(),
                    "group": marker.args[0] if marker and marker.args else None}  # fmt: skip
            with open(where, "a") as timeline:  # one write per line: workers append whole lines
                timeline.write(json.dumps(line) + "\n")
