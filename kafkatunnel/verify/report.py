"""A verify report three ways: a terminal table, JSON, and one self-contained HTML page
with a timeline per group (joins, syncs, commits, errors)."""

from __future__ import annotations

import html
import json
from pathlib import Path
from typing import Any

from rich.markup import escape
from rich.table import Table

from kafkatunnel.verify.events import TRANSACTION
from kafkatunnel.verify.job import Report
from kafkatunnel.verify.judge import Verdict
from kafkatunnel.verify.junit import junit_xml

STYLE = {"ok": "green", "misrouted": "bold red", "unverified": "yellow"}


def table(report: Report) -> Table:
    title = f"{report.files} file(s), {report.frames} frames, {report.calls} calls" + (
        "" if report.tunnel_recording else " (plain capture: no leak check)"
    )
    out = Table(title=title, title_justify="left")
    out.add_column("group / txn id", no_wrap=True)
    for column in ("type", "verdict", "checked", "coordinator", "NOT_COORDINATOR"):
        out.add_column(column, no_wrap=True)
    for verdict in sorted(report.verdicts, key=lambda v: (v.key_type, v.key)):
        out.add_row(
            escape(verdict.key) + _client_key(verdict) + _own(verdict),  # not markup: the
            # recording's
            kind_of(verdict),
            f"[{STYLE[verdict.verdict]}]{verdict.verdict}[/]",
            str(verdict.checked),
            "-" if verdict.coordinator is None else str(verdict.coordinator),
            str(verdict.errors["NOT_COORDINATOR"]),
        )
    return out


def kind_of(verdict: Verdict) -> str:
    """What the key is: a transactional id, or a group of Kafka's type (classic, consumer,
    share, streams), "group" when the recording does not show which."""
    if verdict.key_type == TRANSACTION:
        return "transactional id"
    return f"{verdict.group_type} group" if verdict.group_type else "group"


def _client_key(verdict: Verdict) -> str:
    """An isolated id's name as its client used it (up --isolate)."""
    return "" if verdict.client_key is None else f" (the client's {escape(verdict.client_key)})"


def _client_key_html(group: dict[str, Any]) -> str:
    client = group.get("client_key")
    return "" if client is None else f" (the client's {html.escape(client)})"


def _own(verdict: Verdict) -> str:
    return f" ({escape(verdict.tool)})" if verdict.tool else ""


def address_table(report: Report) -> Table | None:
    """Which broker is behind each address the connections went to, and how that is known."""
    if not report.addresses:
        return None
    out = Table(title="brokers behind the captured addresses", title_justify="left")
    for column in ("address", "broker", "how", "evidence"):
        out.add_column(column, no_wrap=column != "evidence")
    for entry in report.addresses:
        node = entry["node"]
        broker = "ambiguous" if entry["ambiguous"] else ("?" if node is None else str(node))
        evidence = evidence_text(entry)
        if entry["note"]:
            evidence = f"{evidence}; {entry['note']}" if evidence else entry["note"]
        if entry["ambiguous"]:
            evidence += "; " + ", ".join(f"at {c['t_ms']} ms: {_who(c['node'])}"
                                         for c in entry["changes"])  # fmt: skip
        out.add_row(escape(entry["address"]), broker, entry["method"] or "unknown",
                    escape(evidence or "none"))  # fmt: skip
    return out


def evidence_text(entry: dict[str, Any]) -> str:
    """'advertised 1, behaviour 4 (coordinator 3, leader 1)': each method's pieces, and
    what the behaviour was (answers for groups it coordinates, partitions it leads)."""
    said = []
    for method, count in entry["evidence"].items():
        about = entry.get("behaviour") if method == "behaviour" else None
        kinds = f" ({', '.join(f'{k} {n}' for k, n in sorted(about.items()))})" if about else ""
        said.append(f"{method} {count}{kinds}")
    return ", ".join(said)


def _who(node: int | None) -> str:
    return "another broker" if node is None else f"broker {node}"


def summary_lines(report: Report) -> list[str]:
    counts: dict[str, int] = {}
    for verdict in report.verdicts:
        counts[verdict.verdict] = counts.get(verdict.verdict, 0) + 1
    lines = [", ".join(f"{n} {v}" for v, n in sorted(counts.items())) or "no groups recorded"]
    own = sum(1 for v in report.verdicts if v.tool)
    if own:
        lines[0] += (f" ({own} of them kafkatunnel's own, e.g. doctor's smoke groups: their "
                     "unverified look-ups do not fail --strict)")  # fmt: skip
    more = f" and {len(report.sources) - 5} more" if len(report.sources) > 5 else ""
    lines.append(f"read {len(report.sources)} file(s): {', '.join(report.sources[:5])}{more}")
    if not report.tunnel_recording:
        lines.append("plain capture: no leak check was possible (only kafkatunnel recordings "
                     "say which addresses clients were meant to see)")  # fmt: skip
    nothing = report.nothing_checked()
    if nothing:
        lines.append(f"NOTHING CHECKED: {nothing}")
    for verdict in sorted(report.verdicts, key=lambda v: (v.verdict == "ok", v.key_type, v.key)):
        if verdict.reasons:
            client = "" if verdict.client_key is None else f" (the client's {verdict.client_key})"
            lines.append(f"{verdict.key}{client} ({kind_of(verdict)}, {verdict.verdict}): "
                         + "; ".join(verdict.reasons))  # fmt: skip
    for leak in report.leaks:
        lines.append(
            f"leak: {leak['api']} answers named {leak['address']} ({leak['times']} times), "
            "which is not a tunnel address"
        )
    lines.extend(f"problem: {p}" for p in report.problems[:10])
    if len(report.problems) > 10:
        lines.append(f"... and {len(report.problems) - 10} more problems (see --json)")
    if report.unreadable:
        lines.append(f"{report.unreadable} file(s) could not be read as captures")
    return lines


def final_line(report: Report, failed: bool) -> str:
    """The run's last word, in agreement with its exit code: a run that passed without
    checking anything must not read as a pass."""
    if failed:
        return "verify: FAILED"
    if report.nothing_checked():
        return "verify: passed, but NOTHING was checked (--strict fails such a run)"
    return "verify: ok"


def verdict_of_run(report: Report, strict: bool) -> tuple[list[str], bool]:
    """What fails the run beyond the report's own verdict (`strict: ...` lines, --strict
    only), and whether it failed: the CLI and the spark-submit application decide alike."""
    problems = [f"strict: {p}" for p in strict_problems(report)] if strict else []
    return problems, not report.ok or bool(problems)


def strict_problems(report: Report) -> list[str]:
    """What `--strict` fails a run for, beyond a misrouted group or a leak."""
    out = []
    nothing = report.nothing_checked()
    if nothing:
        out.append(nothing)
    unverified = [v.key for v in report.verdicts if v.verdict == "unverified" and not v.tool]
    if unverified:
        out.append(f"{len(unverified)} group(s) or transactional id(s) unverified: "
                   + ", ".join(sorted(unverified)[:10]))  # fmt: skip
    out.extend(f"cut short: {p}" for p in report.cut_short)
    return out


def to_json(report: Report) -> str:
    return json.dumps(report.as_dict(), indent=2)


COLOURS = {"ok": "#1a7f37", "misrouted": "#cf222e", "unverified": "#9a6700"}
CSS = """
body{font:14px/1.4 system-ui,sans-serif;margin:2em;color:#1f2328}
h1{font-size:1.4em}h2{font-size:1.1em;margin-top:2em}
table{border-collapse:collapse;margin:.5em 0}td,th{border:1px solid #d0d7de;padding:2px 8px;
text-align:left;vertical-align:top}.badge{color:#fff;border-radius:4px;padding:1px 6px}
svg{background:#f6f8fa;border:1px solid #d0d7de}.err{color:#cf222e}
"""


def _timeline_svg(moments: list[dict[str, Any]]) -> str:
    if not moments:
        return ""
    width, height = 900, 40
    end = max(m["t_ms"] for m in moments) or 1.0
    marks = []
    for moment in moments:
        x = 10 + (width - 20) * moment["t_ms"] / end
        colour = "#cf222e" if moment["error"] not in (None, 0) else "#0969da"
        if moment["api"] == "FindCoordinator":
            colour = "#8250df"
        label = html.escape(f"{moment['t_ms']} ms {moment['api']} -> broker {moment['broker']}"
                            f" {moment['error'] or ''}")  # fmt: skip
        marks.append(
            f'<circle cx="{x:.1f}" cy="20" r="4" fill="{colour}"><title>{label}</title></circle>'
        )
    return (
        f'<svg width="{width}" height="{height}" role="img">'
        + "".join(marks)
        + f'<text x="10" y="38" font-size="10">0 ms</text><text x="{width - 60}" y="38" '
        f'font-size="10">{end:.0f} ms</text></svg>'
    )


def to_html(report: Report) -> str:
    data = report.as_dict()
    parts = [
        "<!doctype html><html><head><meta charset='utf-8'><title>kafkatunnel verify</title>",
        f"<style>{CSS}</style></head><body>",
        f"<h1>kafkatunnel verify: {'ok' if report.ok else 'FAILED'}</h1>",
        f"<p>{data['files']} file(s), {data['frames']} frames, {data['calls']} calls.</p>",
        "<table><tr><th>group / transactional id</th><th>type</th><th>verdict</th>"
        "<th>checked</th><th>coordinator</th><th>NOT_COORDINATOR</th><th>reasons</th></tr>",
    ]
    kinds = {v.key: kind_of(v) for v in report.verdicts}
    for group in data["groups"]:
        colour = COLOURS[group["verdict"]]
        parts.append(
            f"<tr><td><a href='#g-{html.escape(group['key'])}'>{html.escape(group['key'])}</a>"
            f"{_client_key_html(group)}</td><td>{html.escape(kinds.get(group['key'], ''))}</td>"
            f"<td><span class='badge' style='background:{colour}'>{group['verdict']}"
            f"</span></td><td>{group['checked']}</td><td>{group['coordinator']}</td>"
            f"<td>{group['errors']['NOT_COORDINATOR']}</td>"
            f"<td>{'<br>'.join(html.escape(r) for r in group['reasons'])}</td></tr>"
        )
    parts.append("</table>")
    if data["addresses"]:
        parts.append("<h2>Brokers behind the captured addresses</h2><table><tr><th>address</th>"
                     "<th>broker</th><th>how</th><th>evidence</th><th>note</th></tr>")  # fmt: skip
        for entry in data["addresses"]:
            broker = "ambiguous" if entry["ambiguous"] else entry["node"]
            evidence = evidence_text(entry)
            parts.append(
                f"<tr><td>{html.escape(entry['address'])}</td><td>{html.escape(str(broker))}</td>"
                f"<td>{html.escape(entry['method'] or 'unknown')}</td>"
                f"<td>{html.escape(evidence)}</td><td>{html.escape(entry['note'] or '')}</td></tr>"
            )
        parts.append("</table>")
    parts.append("<h2>Files read</h2><ul>")
    parts.extend(f"<li>{html.escape(source)}</li>" for source in data["sources"])
    parts.append("</ul>")
    if not data["tunnel_recording"]:
        parts.append("<p>Plain capture: no leak check was possible (only kafkatunnel "
                     "recordings say which addresses clients were meant to see).</p>")  # fmt: skip
    if data["leaks"]:
        parts.append("<h2 class='err'>Leaked addresses</h2><ul>")
        parts.extend(
            f"<li>{html.escape(leak['api'])} named {html.escape(leak['address'])} "
            f"({leak['times']} times)</li>"
            for leak in data["leaks"]
        )
        parts.append("</ul>")
    for group in data["groups"]:
        parts.append(f"<h2 id='g-{html.escape(group['key'])}'>{html.escape(group['key'])}</h2>")
        parts.append(_timeline_svg(group["timeline"]))
        parts.append("<table><tr><th>t (ms)</th><th>request</th><th>broker</th><th>error</th>"
                     "<th>member</th><th>generation / epoch</th></tr>")  # fmt: skip
        for moment in group["timeline"]:
            error = moment["error"]
            parts.append(
                f"<tr><td>{moment['t_ms']}</td><td>{html.escape(moment['api'])}</td>"
                f"<td>{moment['broker']}</td>"
                f"<td class='err'>{html.escape(str(error)) if error not in (None, 0) else ''}"
                f"</td><td>{html.escape(str(moment['member'] or ''))}</td>"
                f"<td>{_generation(moment)}</td></tr>"
            )
        parts.append("</table>")
    if data["problems"]:
        parts.append("<h2>Problems reading the recordings</h2><ul>")
        parts.extend(f"<li>{html.escape(p)}</li>" for p in data["problems"])
        parts.append("</ul>")
    parts.append("</body></html>")
    return "\n".join(parts)


def _generation(moment: dict[str, Any]) -> str:
    """A classic member's generation, or a consumer, share or streams member's epoch."""
    if moment.get("generation") is not None:
        return str(moment["generation"])
    epoch = moment.get("epoch")
    return "" if epoch is None else f"epoch {epoch}"


def write_reports(
    report: Report,
    json_file: str | None,
    html_file: str | None,
    junit_file: str | None = None,
    strict: bool = False,
) -> None:
    """The report as JSON (to json_file, or standard output for "-"), as HTML, and as
    JUnit XML (whose unverified cases fail under `strict`, as the run does)."""
    if json_file:
        text = to_json(report)
        if json_file == "-":
            print(text)
        else:
            Path(json_file).write_text(text + "\n")
    if html_file:
        Path(html_file).write_text(to_html(report))
    if junit_file:
        Path(junit_file).write_bytes(junit_xml(report, strict))
