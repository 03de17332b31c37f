"""The live table says what the tunnel refuses and how often, under the brokers."""

from __future__ import annotations

import io

import pytest
from rich.console import Console

from kafkatunnel.tunnel.view import status_table

pytestmark = pytest.mark.quick


def _endpoint(node: int | None, refused: dict[str, int]) -> dict[str, object]:
    return {"node_id": node, "advertised": f"kafka-{node}:9092", "tunnel": "127.0.0.1:9093",
            "route": "exec", "state": "listening", "connections": 1, "bytes_in": 10,
            "bytes_out": 20, "errors": 0, "last_error": None, "note": None,
            "api_refused": refused}  # fmt: skip


def test_the_table_says_what_read_only_refused() -> None:
    status = {
        "bootstrap_servers": "127.0.0.1:9092",
        "via": "exec",
        "policy": {"read_only": True, "refused_apis": ["Produce"], "refused": 3},
        "endpoints": [_endpoint(None, {"DeleteTopics": 1}), _endpoint(1, {"DeleteTopics": 1,
                                                                          "Produce": 1})],
    }  # fmt: skip
    out = io.StringIO()
    Console(file=out, width=200).print(status_table(status, cut=False))
    assert "read-only: 3 request(s) refused (DeleteTopics 2, Produce 1)" in out.getvalue()


def test_the_table_names_the_isolated_groups_as_one_printable_line_each() -> None:
    """The groups are what clients named: a name is never markup, never a control
    sequence, and a long list is cut with how many more there are."""
    groups = ["orders", "[red]pay\x1b[2Jments[/]", *(f"g{i}" for i in range(12))]
    status = {"bootstrap_servers": "127.0.0.1:9092", "via": "exec",
              "isolation": {"suffix": "kt-anna", "groups": groups},
              "endpoints": [_endpoint(None, {})]}  # fmt: skip
    out = io.StringIO()
    Console(file=out, width=400).print(status_table(status, cut=False))
    said = " ".join(out.getvalue().split())  # the caption wraps
    assert "\x1b" not in said
    assert ("isolated: group and transactional ids are ID.kt-anna on the cluster; groups: "
            "orders, [red]pay [2Jments[/], g0, g1") in said  # fmt: skip
    assert "g7 and 4 more" in said and "g8" not in said
