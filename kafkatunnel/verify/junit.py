"""A verify report as JUnit XML, the test-report format CI systems (GitHub Actions,
GitLab, Jenkins) render: one test case per group and transactional id, and one for the
leak check.

A group's class names its type (`group.classic`, `group.consumer`, `group.share`,
`group.streams`), so CI shows each kind of group together.
ok: passed. misrouted: a failure, its reasons and timeline as the evidence. unverified:
skipped, or a failure under --strict (but for the tool's own look-ups, which only skip).
Group ids come from the recording: any text, so characters XML 1.0 cannot hold are written
as \\uXXXX escapes rather than making the file unreadable, and a backslash as two, so an id
that holds the text \\u0001 is never read as one that holds U+0001.
"""

from __future__ import annotations

import re
import xml.etree.ElementTree as ET
from typing import Any

from kafkatunnel.verify.events import TRANSACTION
from kafkatunnel.verify.job import Report
from kafkatunnel.verify.judge import MISROUTED, OK, Verdict

SUITE = "kafkatunnel verify"
_ESCAPED = re.compile("[\\\\]|[^\t\n\r\x20-\ud7ff\ue000-\ufffd\U00010000-\U0010ffff]")


def _escape(found: re.Match[str]) -> str:
    character = found.group()
    return "\\\\" if character == "\\" else f"\\u{ord(character):04x}"


def _text(value: object) -> str:
    """The text with what XML 1.0 cannot hold as \\uXXXX, and a backslash as \\\\."""
    return _ESCAPED.sub(_escape, str(value))


def _classname(verdict: Verdict) -> str:
    """`group.share`, `group.streams`, ...: a group's type as a class of the `group`
    package (plain `group` when the recording does not show its type)."""
    if verdict.tool:
        return _text(verdict.tool)
    if verdict.key_type == TRANSACTION:
        return "transactional_id"
    return f"group.{verdict.group_type}" if verdict.group_type else "group"


def _evidence(verdict: Verdict) -> str:
    lines = [f"{verdict.verdict}: {reason}" for reason in verdict.reasons]
    if verdict.coordinator is not None:
        lines.append(f"coordinator named by FindCoordinator: broker {verdict.coordinator}")
    lines.extend(_moment(moment) for moment in verdict.timeline)
    return "\n".join(lines)


def _moment(moment: dict[str, Any]) -> str:
    line = f"{moment['t_ms']:>10} ms  {moment['api']} -> broker {moment['broker']}"
    if moment["error"] not in (None, 0):
        line += f"  {moment['error']}"
    if moment["member"] and moment.get("generation") is not None:
        line += f"  member {moment['member']} generation {moment['generation']}"
    elif moment["member"]:
        line += f"  member {moment['member']} epoch {moment.get('epoch')}"
    return line


def _case(suite: ET.Element, name: str, classname: str) -> ET.Element:
    return ET.SubElement(suite, "testcase", name=_text(name), classname=classname, time="0")


def junit_xml(report: Report, strict: bool) -> bytes:
    """The report as a JUnit XML document (UTF-8)."""
    root = ET.Element("testsuites", name=SUITE)
    suite = ET.SubElement(root, "testsuite", name=SUITE)
    properties = ET.SubElement(suite, "properties")
    for name, value in (("files", report.files), ("frames", report.frames),
                        ("calls", report.calls), ("strict", strict)):  # fmt: skip
        ET.SubElement(properties, "property", name=name, value=str(value).lower())
    failures = skipped = 0
    for verdict in sorted(report.verdicts, key=lambda v: (v.tool or "", v.key_type, v.key)):
        case = _case(suite, verdict.key, _classname(verdict))
        reason = _text(verdict.reasons[0] if verdict.reasons else verdict.verdict)
        if verdict.verdict == OK:
            ET.SubElement(case, "system-out").text = _text(_evidence(verdict))
        elif verdict.verdict == MISROUTED or (strict and not verdict.tool):
            failures += 1
            failure = ET.SubElement(case, "failure", type=verdict.verdict, message=reason)
            failure.text = _text(_evidence(verdict))
        else:
            skipped += 1
            ET.SubElement(case, "skipped", message=f"unverified: {reason}")
    case = _case(suite, "no broker address leaked to clients", "leaks")
    if not report.tunnel_recording:
        skipped += 1
        ET.SubElement(case, "skipped", message="a plain capture: only kafkatunnel recordings "
                      "say which addresses clients were meant to see")  # fmt: skip
    elif report.leaks:
        failures += 1
        failure = ET.SubElement(case, "failure", type="leak",
                                message=f"{len(report.leaks)} address(es) leaked")  # fmt: skip
        failure.text = _text("\n".join(
            f"{leak['api']} answers named {leak['address']} ({leak['times']} times)"
            for leak in report.leaks
        ))  # fmt: skip
    tests = len(report.verdicts) + 1
    for element in (root, suite):
        element.set("tests", str(tests))
        element.set("failures", str(failures))
        element.set("errors", "0")
        element.set("skipped", str(skipped))
    ET.indent(root)
    document: bytes = ET.tostring(root, encoding="utf-8", xml_declaration=True)
    return document
