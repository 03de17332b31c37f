"""Output that fits where it goes: piped (a CI log), with COLUMNS unset, no line is cut:
help names every option and variable in full and shows flags as flags, verify's table
keeps every column, and `--json -` is the JSON alone."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import typer

from kafkatunnel.cli.main import app
from kafkatunnel.cli.settings import add_environment_variables
from tests.verify.conftest import DATA

pytestmark = pytest.mark.quick

ROUTED = DATA / "recordings" / "routed"
ELLIPSIS = "…"


def _piped(*args: str, cwd: Path | None = None) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if k not in ("COLUMNS", "TERMINAL_WIDTH")}
    return subprocess.run(
        [sys.executable, "-m", "kafkatunnel", *args],
        capture_output=True, text=True, timeout=120, env=env, cwd=cwd,
    )  # fmt: skip


def _commands() -> list[tuple[list[str], typer.core.TyperCommand]]:
    group = typer.main.get_command(app)
    add_environment_variables(group)  # type: ignore[arg-type]
    found: list[tuple[list[str], typer.core.TyperCommand]] = []
    for name, command in group.commands.items():  # type: ignore[attr-defined]
        subs = getattr(command, "commands", None)
        if subs:
            found.extend(([name, sub_name], sub) for sub_name, sub in subs.items())
        else:
            found.append(([name], command))
    return found


COMMANDS = _commands()


@pytest.mark.parametrize(
    ("path", "command"), COMMANDS, ids=[" ".join(path) for path, _ in COMMANDS]
)
def test_help_names_everything_in_full(path: list[str], command: typer.core.TyperCommand) -> None:
    result = _piped(*path, "--help")
    assert result.returncode == 0, result.stderr
    text = result.stdout
    assert ELLIPSIS not in text and "<bool>" not in text, text
    for param in command.params:
        for opt in [*param.opts, *getattr(param, "secondary_opts", [])]:
            if opt.startswith("--"):
                assert opt in text, (opt, text)
        if isinstance(param.envvar, str):
            assert param.envvar in text, (param.envvar, text)


def test_verify_keeps_every_column_and_json_alone_on_stdout(tmp_path: Path) -> None:
    report_file = tmp_path / "report.json"
    table = _piped("verify", "--in-process", str(ROUTED), "--json", str(report_file))
    report = json.loads(report_file.read_text())
    assert ELLIPSIS not in table.stdout, table.stdout
    header = next(line for line in table.stdout.splitlines() if "verdict" in line)
    for column in ("group / txn id", "verdict", "checked", "coordinator", "NOT_COORDINATOR"):
        assert column in header, header
    assert report["groups"]
    for group in report["groups"]:
        assert group["key"] in table.stdout

    alone = _piped("verify", "--in-process", str(ROUTED), "--json", "-")
    assert json.loads(alone.stdout) == report  # nothing else on standard output
    assert "verify: ok" in alone.stderr
