"""The suite's own scheduling (tests/scheduling.py), run as the suite runs: pytest-xdist
workers over a small suite that writes down where and when each test ran."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]

SUITE = """
import json, os, time
import pytest

LOG = os.environ["KT_SCHEDULING_LOG"]

def note(name, started):
    with open(LOG, "a") as log:
        log.write(json.dumps({"test": name, "worker": os.environ["PYTEST_XDIST_WORKER"],
                              "start": started, "end": time.time()}) + "\\n")

@pytest.fixture(scope="module")
def world():
    return object()

@pytest.mark.parametrize("n", range(4))
def test_in_a_world(world, n):
    started = time.time(); time.sleep(0.2); note(f"world-{n}", started)

@pytest.mark.parametrize("n", range(8))
def test_anywhere(n):
    started = time.time(); time.sleep(0.3); note(f"anywhere-{n}", started)

@pytest.mark.alone
@pytest.mark.parametrize("n", range(3))
def test_alone(n):
    started = time.time(); time.sleep(0.4); note(f"alone-{n}", started)
"""


def small_suite(where: Path, source: str) -> None:
    """`source` as a test module of its own, scheduled by tests/scheduling.py."""
    (where / "test_small.py").write_text(source)
    (where / "conftest.py").write_text('pytest_plugins = ["tests.scheduling"]\n')
    (where / "pytest.ini").write_text("[pytest]\nmarkers =\n    alone: a\n    quick: q\n")


def test_worlds_share_a_worker_and_alone_tests_run_while_nothing_else_does(
    tmp_path: Path,
) -> None:
    small_suite(tmp_path, textwrap.dedent(SUITE))
    log = tmp_path / "log.jsonl"
    env = {**os.environ, "KT_SCHEDULING_LOG": str(log), "PYTHONPATH": str(ROOT)}
    env.pop("KT_TEST_LOCKS", None)  # the small suite's own run, not this one's
    result = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "--numprocesses=3",
         "--dist=loadgroup", "test_small.py"],
        cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert result.returncode == 0, result.stdout + result.stderr
    runs = [json.loads(line) for line in log.read_text().splitlines()]
    assert len(runs) == 15
    assert len({r["worker"] for r in runs if r["test"].startswith("world-")}) == 1
    assert len({r["worker"] for r in runs}) == 3  # the rest did run side by side
    alone = [r for r in runs if r["test"].startswith("alone-")]
    others = [r for r in runs if not r["test"].startswith("alone-")]
    for a in alone:
        overlapping = [o["test"] for o in others if o["start"] < a["end"] and a["start"] < o["end"]]
        assert not overlapping, (a, overlapping)


@pytest.mark.quick
def test_a_quick_test_that_uses_a_world_is_refused(tmp_path: Path) -> None:
    small_suite(
        tmp_path,
        "import pytest\n\n@pytest.fixture\ndef cluster():\n    return 1\n\n"
        "@pytest.mark.quick\ndef test_it(cluster):\n    pass\n",
    )
    result = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "test_small.py"],
        cwd=tmp_path, env={**os.environ, "PYTHONPATH": str(ROOT)}, capture_output=True,
        text=True, timeout=120,
    )  # fmt: skip
    assert result.returncode != 0
    assert "tests marked quick that are not" in result.stdout + result.stderr
    assert "test_it uses ['cluster']" in result.stdout + result.stderr


@pytest.mark.quick
def test_a_module_that_overrides_a_wider_world_is_a_group_of_its_own(tmp_path: Path) -> None:
    """A module with its own cluster (its fixture overrides the package's of the same
    name) runs on a worker of its own, beside the package's tests, not after them."""
    small_suite(tmp_path, "def test_other(world):\n    pass\n")
    (tmp_path / "conftest.py").write_text(
        'import pytest\n\npytest_plugins = ["tests.scheduling"]\n\n'
        '@pytest.fixture(scope="package")\ndef world():\n    return 1\n'
    )
    (tmp_path / "__init__.py").write_text("")
    (tmp_path / "test_own.py").write_text(
        'import pytest\n\n@pytest.fixture(scope="module")\ndef world():\n    return 2\n\n'
        "def test_own(world):\n    pass\n"
    )
    (tmp_path / "groups.py").write_text(
        "def pytest_collection_finish(session):\n"
        "    for item in session.items:\n"
        "        print('GROUP', item.name, item.get_closest_marker('xdist_group').args[0])\n"
    )
    result = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-s", "-p", "no:cacheprovider", "-p", "groups",
         "--collect-only", "test_small.py", "test_own.py"],
        cwd=tmp_path, env={**os.environ, "PYTHONPATH": f"{ROOT}:{tmp_path}"},
        capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    groups = dict(
        line.split()[1:] for line in result.stdout.splitlines() if line.startswith("GROUP")
    )
    assert set(groups) == {"test_other", "test_own"}, result.stdout + result.stderr
    assert groups["test_other"] != groups["test_own"], groups
