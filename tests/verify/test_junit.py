"""`verify --junit`: the report as JUnit XML, read back by junitparser (the parser CI
result publishers use), not by our own writer. One recording holds ok groups, misrouted
ones (a copy whose listeners say its connections reached the wrong brokers) and unverified
ones (a copy whose look-ups were left out, its ids hostile to XML and to terminal markup),
and ok ones whose ids hold the text of an escape. A second recording leaks addresses."""

from __future__ import annotations

import dataclasses
import re
import subprocess
import sys
from pathlib import Path

import pytest
from junitparser.junitparser import Failure, JUnitXml, Skipped

from kafkatunnel.capture.recorder import Listener
from kafkatunnel.probe import own_client
from kafkatunnel.verify.job import Report, verify_local
from kafkatunnel.verify.judge import Verdict
from kafkatunnel.verify.junit import junit_xml
from tests.verify.conftest import ROUTED
from tests.worlds.copies import read_sample, record_copies

pytestmark = pytest.mark.quick

FIND_COORDINATOR = b"\x00\x0a"
SAMPLE = read_sample(sorted(ROUTED.iterdir()))
OK_TAG = b"fine-000001"
MISROUTED_TAG = b"wrong-00002"
HOSTILE_TAG = b'<\x01&]]>"[/x]'  # no look-ups recorded for these: unverified
ESCAPE_TAG = b"\\u0001-look"  # the text of an escape, not U+0001: ok


@pytest.fixture(scope="module")
def recording(tmp_path_factory: pytest.TempPathFactory) -> Path:
    directory = tmp_path_factory.mktemp("junit")

    def keep(to_server: bool, frame: bytes) -> bool:
        return not (to_server and frame[4:6] == FIND_COORDINATOR and HOSTILE_TAG in frame)

    def relisten(tag: bytes, listener: Listener) -> Listener:
        if tag != MISROUTED_TAG or listener.node_id is None:
            return listener
        return dataclasses.replace(listener, node_id=listener.node_id % 3 + 1)

    tags = [OK_TAG, MISROUTED_TAG, HOSTILE_TAG, ESCAPE_TAG]
    assert all(len(tag) == len(SAMPLE.prefix) for tag in tags)
    record_copies(directory, SAMPLE, tags, keep=keep, relisten=relisten)
    return directory


@pytest.fixture(scope="module")
def report(recording: Path) -> Report:
    return verify_local([str(recording)])


def cases(xml: bytes) -> dict[str, tuple[str, str, object]]:
    """name -> (classname, outcome, the result element) as junitparser reads them."""
    suites = JUnitXml.fromstring(xml.decode())
    out: dict[str, tuple[str, str, object]] = {}
    for suite in suites:
        for case in suite:
            results = case.result
            outcome = type(results[0]).__name__.lower() if results else "passed"
            out[case.name] = (case.classname, outcome, results[0] if results else None)
    return out


def unescape(name: str) -> str:
    """A name as the JUnit file escapes it (\\uXXXX, \\\\) read back to the id."""
    return re.sub(r"\\(\\|u([0-9a-f]{4}))",
                  lambda m: chr(int(m.group(2), 16)) if m.group(2) else "\\", name)  # fmt: skip


def verdicts(report: Report) -> dict[str, str]:
    return {v.key: v.verdict for v in report.verdicts}


def expected_class(verdict: Verdict) -> str:
    """The tool's own look-ups; transactional ids; groups by their type."""
    if verdict.tool:
        return "kafkatunnel"
    if verdict.key_type:
        return "transactional_id"
    return f"group.{verdict.group_type}" if verdict.group_type else "group"


def test_each_group_is_a_case_named_by_its_verdict(report: Report) -> None:
    expected = verdicts(report)
    assert {"ok", "misrouted", "unverified"} <= set(expected.values())
    found = cases(junit_xml(report, strict=False))
    names = {unescape(name) for name, (classname, _, _) in found.items() if classname != "leaks"}
    classes = {v.key: expected_class(v) for v in report.verdicts}
    assert {"group.classic", "transactional_id"} <= set(classes.values()), classes  # each kind
    assert len(found) == len(expected) + 1  # and the leak check
    assert names == set(expected)  # each id once, as it is, U+0001 and the text \\u0001 apart
    assert any("\x01" in key for key in expected) and any("\\" in key for key in expected)
    for name, (classname, outcome, result) in found.items():
        key = unescape(name)
        if classname == "leaks":
            assert outcome == "passed"
            continue
        assert classname == classes[key], (key, classname)
        verdict = expected[key]
        assert (
            outcome == {"ok": "passed", "misrouted": "failure", "unverified": "skipped"}[verdict]
        ), (key, verdict, outcome)
        if verdict == "misrouted":
            assert isinstance(result, Failure) and result.type == "misrouted"
            assert "went to broker" in (result.text or "")  # the evidence
            assert "FindCoordinator" in (result.text or "")  # and the timeline
        if verdict == "unverified":
            assert isinstance(result, Skipped) and "unverified" in (result.message or "")
    suite = next(iter(JUnitXml.fromstring(junit_xml(report, strict=False).decode())))
    counted = list(expected.values())
    assert suite.tests == len(counted) + 1
    assert suite.failures == counted.count("misrouted")
    assert suite.skipped == counted.count("unverified")


def test_strict_fails_the_unverified_cases(report: Report) -> None:
    found = cases(junit_xml(report, strict=True))
    outcomes = {o for name, (_, o, _) in found.items() if name.startswith("<")}
    assert outcomes == {"failure"}
    own = {o for c, o, _ in found.values() if c == "kafkatunnel"}  # the tool's own look-ups
    assert own == {"skipped"}


def test_a_recording_with_a_leak_fails_the_leak_case(tmp_path: Path) -> None:
    """A tunnel whose answers named addresses other than its listeners' (recorded on
    127.0.0.3, the answers still name 127.0.0.1's): the leak case fails, naming them."""

    def moved(tag: bytes, listener: Listener) -> Listener:
        return dataclasses.replace(
            listener, tunnel=listener.tunnel.replace("127.0.0.1:", "127.0.0.3:")
        )

    record_copies(tmp_path, SAMPLE, [OK_TAG], relisten=moved)
    report = verify_local([str(tmp_path)])
    assert report.leaks and not report.ok
    xml = junit_xml(report, strict=False)
    _, outcome, result = cases(xml)["no broker address leaked to clients"]
    assert outcome == "failure" and isinstance(result, Failure) and result.type == "leak"
    assert result.message == f"{len(report.leaks)} address(es) leaked"
    for leak in report.leaks:
        assert leak["address"].startswith("127.0.0.1:")
        assert f"{leak['api']} answers named {leak['address']}" in (result.text or "")
    suite = next(iter(JUnitXml.fromstring(xml.decode())))
    assert suite.failures == 1 + sum(v.verdict == "misrouted" for v in report.verdicts)


def test_the_command_writes_the_file_and_prints_hostile_ids_as_text(
    recording: Path, tmp_path: Path
) -> None:
    target = tmp_path / "verify.xml"
    out = subprocess.run(
        [sys.executable, "-m", "kafkatunnel", "verify", "--in-process", "--junit", str(target),
         str(recording)], capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert out.returncode == 1, out.stdout + out.stderr  # misrouted groups fail the run
    assert "Traceback" not in out.stderr
    # the id as it is, not read as markup
    assert '"[/x]-g-0 (classic group, unverified)' in out.stdout
    names = set(cases(target.read_bytes()))
    assert f"{MISROUTED_TAG.decode()}-g-0" in names and f"{OK_TAG.decode()}-g-0" in names
    wrong = subprocess.run(
        [sys.executable, "-m", "kafkatunnel", "verify", "--in-process", "--junit",
         str(tmp_path / "no" / "such" / "dir.xml"), str(recording)],
        capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert wrong.returncode == 2 and "--junit" in wrong.stderr and "Traceback" not in wrong.stderr


def test_only_the_tools_own_client_ids_are_the_tools() -> None:
    """A recording's client ids are anybody's: one that merely starts like the tool's is an
    application's, whose unverified groups --strict still fails."""
    for ours in ("kafkatunnel", "kafkatunnel-doctor", "kafkatunnel-replay"):
        assert own_client(ours) == ours
    for theirs in ("kafkatunnel-[/x]", "kafkatunnel-\x01", "kafkatunnel-", "kafkatunnelx",
                   "my-kafkatunnel", "kafkatunnel-doctor\n", None):  # fmt: skip
        assert own_client(theirs) is None, theirs
