"""The live table, rendered from the same status dict that `status --json` prints."""

from __future__ import annotations

import time
from typing import Any

from rich.markup import escape
from rich.table import Table


def _bytes(n: int) -> str:
    size = float(n)
    for unit in ("B", "KiB", "MiB", "GiB"):
        if size < 1024 or unit == "GiB":
            return f"{size:.0f} {unit}" if unit == "B" else f"{size:.1f} {unit}"
        size /= 1024
    return f"{n} B"


def _cells(e: dict[str, Any]) -> tuple[str, ...]:
    """A listener's cells after its name: tunnel address, forward, traffic, errors."""
    if e["state"] != "listening":
        state = f"[red]{e['state']}[/]"
    elif "(ready)" in e["route"] or "(" not in e["route"]:
        state = f"[green]ok[/] {escape(e['route'])}"
    else:
        state = f"[yellow]{escape(e['route'])}[/]"
    login = e.get("login")
    if login:  # who the tunnel logs in as there (its name is the user's: never markup)
        renewed = login.get("reauthentications")
        again = f"; sessions renewed {renewed}x" if renewed else ""
        state += escape(f", as {login['principal']} ({login['mechanism']}{again})")
        if login.get("token_expires_at"):  # OAUTHBEARER: when the token it sent ends
            until = time.strftime("%H:%M:%S", time.localtime(login["token_expires_at"]))
            state += f", token until {until}"
        if login.get("token_error"):  # no new one came: why is in the errors column
            state += ", not refreshed"
    errors = str(e["errors"])
    if e["last_error"]:
        errors = f"[red]{e['errors']}[/] {escape(e['last_error'])}"
    elif login and login.get("token_error"):  # the token held still serves, for now
        said = escape(f"token not refreshed: {login['token_error']}")
        errors = f"{e['errors']} [yellow]{said}[/]"
    elif e.get("note"):
        errors = f"{e['errors']} [yellow]{escape(e['note'])}[/]"
    return (e["tunnel"], state, str(e["connections"]), _bytes(e["bytes_in"]),
            _bytes(e["bytes_out"]), errors)  # fmt: skip


def status_table(status: dict[str, Any], cut: bool = True) -> Table:
    """One line per broker; `cut`: long routes and errors end in an ellipsis (a terminal),
    else every cell in full (a log, a pipe)."""
    table = Table(
        title=f"kafkatunnel  bootstrap.servers={status['bootstrap_servers']}  via {status['via']}",
        title_justify="left",
    )
    columns = (  # name, justify, min width, max width
        ("node", "right", 4, 9), ("advertised", "left", 15, None), ("tunnel", "left", 15, 21),
        ("forward", "left", 8, 48), ("conns", "right", 5, 5), ("in", "right", 6, 10),
        ("out", "right", 6, 10), ("errors", "left", 6, 60),
    )  # fmt: skip
    for column, justify, low, high in columns:
        table.add_column(
            column,
            justify=justify,  # type: ignore[arg-type]
            no_wrap=True,
            overflow="ellipsis" if cut else "fold",
            min_width=low,
            max_width=high if cut else None,
        )
    for e in status["endpoints"]:
        node = "bootstrap" if e["node_id"] is None else str(e["node_id"])
        table.add_row(node, e["advertised"], *_cells(e))
    for c in status.get("companions", []):  # the services beside the brokers
        table.add_row(c["kind"] or "service", f"{c['name']}.{c['namespace']}:{c['port']}",
                      *_cells(c))  # fmt: skip
    notes = list(status.get("notes", []))
    if status.get("refused_total"):
        first = status["refused"][0] if status.get("refused") else None
        example = f": node {first['node_id']}, {first['reason']}" if first else ""
        notes.append(f"{status['refused_total']} broker(s) refused{example}")
    policy = status.get("policy")
    if policy:
        notes.insert(0, _refusals(policy, status["endpoints"]))
    isolation = status.get("isolation")
    if isolation:
        notes.insert(0, isolated(isolation))
    users = status.get("login_users")
    if users and users["refused"]:
        notes.append(f"login: {users['refused']} connection(s) of other users of this machine "
                     "refused")  # fmt: skip
    if notes:  # names from the cluster: never markup
        table.caption = escape("\n".join(notes))
    return table


GROUPS_SHOWN = 10  # of the groups an isolating tunnel's clients used (status --json: all)


def isolated(isolation: dict[str, Any]) -> str:
    """What --isolate maps, and the groups clients used so far (as they named them: a
    client's text, made one printable line each)."""
    from kafkatunnel.protocol import one_line  # the table is drawn without kio otherwise

    suffix, groups = isolation["suffix"], isolation["groups"]
    shown = [one_line(g, 80) for g in groups[:GROUPS_SHOWN]]
    more = f" and {len(groups) - GROUPS_SHOWN} more" if len(groups) > GROUPS_SHOWN else ""
    used = f": {', '.join(shown)}{more}" if groups else ": none used yet"
    return (f"isolated: group and transactional ids are ID.{suffix} on the cluster; "
            f"groups{used}")  # fmt: skip


def _refusals(policy: dict[str, Any], endpoints: list[dict[str, Any]]) -> str:
    """What the tunnel refuses, and how often it did, per API."""
    kind = "read-only" if policy["read_only"] else "refusing " + ", ".join(policy["refused_apis"])
    counts: dict[str, int] = {}
    for e in endpoints:
        for api, count in e.get("api_refused", {}).items():
            counts[api] = counts.get(api, 0) + count
    done = ", ".join(f"{api} {count}" for api, count in sorted(counts.items()))
    return f"{kind}: {policy['refused']} request(s) refused" + (f" ({done})" if done else "")
