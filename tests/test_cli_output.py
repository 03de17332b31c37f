"""Output that fits where it goes, and says everything whole. Piped (a CI log), with
COLUMNS unset, no line is cut; on a terminal, 80 columns or 300, no word is: help names
every option and variable in full and shows flags as flags, a group lists each of its
commands (read from the app, not from a list here) by its first sentence, no line of help
ends where its next word had room, verify's table keeps every column, and `--json -` is
the JSON alone."""

from __future__ import annotations

import fcntl
import functools
import inspect
import itertools
import json
import os
import pty
import re
import select
import struct
import subprocess
import sys
import termios
import time
from pathlib import Path

import pytest
import typer

from kafkatunnel.cli.main import app
from kafkatunnel.cli.settings import add_environment_variables
from tests.verify.conftest import DATA

pytestmark = pytest.mark.quick

ROUTED = DATA / "recordings" / "routed"
ELLIPSIS = "…"
ANSI = re.compile(r"\x1b\[[0-9;?]*[A-Za-z]")  # colours and cursor codes on a terminal
BORDERS = str.maketrans("", "", "╭╮╰╯│─")  # Rich's panels
HYPHEN_BREAK = re.compile(r"\w-\s*$")  # a line that ends inside a word, at its hyphen
# where help goes: a pipe (as in CI), a pipe with COLUMNS, terminals narrow and wide
WHERE = ["piped", "piped, COLUMNS=80", "terminal, 80 columns", "terminal, 300 columns"]
UNWRAPPED = ["piped", "terminal, 300 columns"]  # no paragraph of help needs to wrap there
TIMEOUT = 120.0


def _environment(**settings: str) -> dict[str, str]:
    drop = ("COLUMNS", "LINES", "TERMINAL_WIDTH")
    return {**{k: v for k, v in os.environ.items() if k not in drop}, **settings}


def _piped(*args: str, cwd: Path | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "kafkatunnel", *args],
        capture_output=True, text=True, timeout=TIMEOUT, env=_environment(), cwd=cwd,
    )  # fmt: skip


def _on_terminal(columns: int, *args: str) -> str:
    """What a user sees at a terminal `columns` wide (a pseudo-terminal of that size, so
    the command asks the terminal, not COLUMNS), colours and cursor codes taken out."""
    main, side = pty.openpty()
    fcntl.ioctl(side, termios.TIOCSWINSZ, struct.pack("HHHH", 50, columns, 0, 0))
    out = bytearray()
    command = [sys.executable, "-m", "kafkatunnel", *args]
    terminal = _environment(TERM="xterm-256color")
    with subprocess.Popen(command, stdin=side, stdout=side, stderr=side, env=terminal) as process:
        os.close(side)
        deadline = time.monotonic() + TIMEOUT
        while (left := deadline - time.monotonic()) > 0:
            if not select.select([main], [], [], left)[0]:
                continue
            try:
                chunk = os.read(main, 65536)
            except OSError:  # EIO: the command closed the terminal (it ended)
                break
            if not chunk:
                break
            out += chunk
        os.close(main)
        assert left > 0, f"no end of `{' '.join(args)}` within {TIMEOUT:g} s: {out.decode()}"
        assert process.wait(timeout=TIMEOUT) == 0, out.decode()
    return ANSI.sub("", out.decode().replace("\r\n", "\n"))


@functools.cache
def _help(where: str, path: tuple[str, ...]) -> str:
    """`kafkatunnel PATH --help` as it reads `where`."""
    if where.startswith("terminal"):
        return _on_terminal(int(where.split()[1]), *path, "--help")
    columns = {"COLUMNS": "80"} if "COLUMNS" in where else {}
    result = subprocess.run([sys.executable, "-m", "kafkatunnel", *path, "--help"],
                            capture_output=True, text=True, timeout=TIMEOUT,
                            env=_environment(**columns))  # fmt: skip
    assert result.returncode == 0, result.stderr
    return result.stdout


def _groups(group: typer.Typer, path: tuple[str, ...] = ()) -> dict[tuple[str, ...], typer.Typer]:
    """The app's groups (itself, `dns`, `config`) by their path, as the app registered them."""
    found = {path: group}
    for sub in group.registered_groups:
        assert sub.name and sub.typer_instance
        found.update(_groups(sub.typer_instance, (*path, sub.name)))
    return found


def _listed(group: typer.Typer) -> dict[str, str]:
    """The help of each command a group has, by name, as the app registered them."""
    found = {}
    for command in group.registered_commands:
        assert command.callback is not None
        name = command.name or typer.main.get_command_name(command.callback.__name__)
        found[name] = command.help or inspect.getdoc(command.callback) or ""
    for sub in group.registered_groups:
        assert sub.name and sub.typer_instance and isinstance(sub.typer_instance.info.help, str)
        found[sub.name] = sub.typer_instance.info.help
    return found


GROUPS = _groups(app)
HELPS = {(*path, name): text for path, group in GROUPS.items()
         for name, text in _listed(group).items()}  # fmt: skip
HELPS[()] = str(app.info.help)


def _paragraph(text: str) -> str:
    """A help text's first paragraph, its whitespace normalised."""
    return " ".join(inspect.cleandoc(text).split("\n\n")[0].split())


def _sentence(text: str) -> str:
    found = re.match(r"(.+?[.?!])(?:\s|$)", _paragraph(text))
    assert found, text
    return found.group(1)


def _normalised(text: str) -> str:
    return " ".join(text.translate(BORDERS).split())


def _listing(text: str) -> dict[str, list[str]]:
    """A group's list of commands: each command's lines of help by its name."""
    heading = re.search(r"^(?:╭─ Commands |Commands:)", text, re.MULTILINE)
    assert heading, f"no list of commands: {text}"
    rows: dict[str, list[str]] = {}
    column = None
    for line in text[heading.end() :].splitlines()[1:]:
        if line.startswith("╰"):
            break
        line = line.translate(BORDERS).rstrip()
        if not line.strip():
            continue
        if column is None:  # the first row: where the help begins
            first = re.match(r"(\s*\S+\s+)\S", line)
            assert first, line
            column = len(first.group(1))
        name = line[:column].strip()
        if name:
            rows[name] = []
        rows[list(rows)[-1]].append(line[column:].strip())
    return rows


def _description(text: str) -> list[list[str]]:
    """The paragraphs of a help's own text, between its usage line and its first section."""
    lines = text.splitlines()
    start = next(i for i, line in enumerate(lines) if "Usage:" in line) + 1
    paragraphs: list[list[str]] = [[]]
    for line in lines[start:]:
        if line.startswith("╭") or re.match(r"\S.*:$", line):
            break
        if line.strip():
            paragraphs[-1].append(line.strip())
        elif paragraphs[-1]:
            paragraphs.append([])
    return [p for p in paragraphs if p]


def _ends_with_room(lines: list[str], width: int) -> list[str]:
    """Lines of one wrapped paragraph that end though the next line's first word would have
    fit on them: `width` is no more than the room there was (the longest line of their
    column), so a line that wraps greedily, at the width, is never one."""
    return [f"{line!r} ends though {after.split()[0]!r} had room (width {width})"
            for line, after in itertools.pairwise(lines)
            if len(line) + 1 + len(after.split()[0]) <= width]  # fmt: skip


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


@pytest.mark.parametrize("where", WHERE)
@pytest.mark.parametrize(
    ("path", "command"), COMMANDS, ids=[" ".join(path) for path, _ in COMMANDS]
)
def test_help_names_everything_in_full(
    path: list[str], command: typer.core.TyperCommand, where: str
) -> None:
    text = _help(where, tuple(path))
    assert ELLIPSIS not in text and "<bool>" not in text, text
    broken = [line for line in text.translate(BORDERS).splitlines() if HYPHEN_BREAK.search(line)]
    assert not broken, "\n".join([*broken, text])  # `--sasl-` / `username`, `no-` / `transactional`
    for param in command.params:
        for opt in [*param.opts, *getattr(param, "secondary_opts", [])]:
            if opt.startswith("--"):
                assert opt in text, (opt, text)
        if isinstance(param.envvar, str):
            assert param.envvar in text, (param.envvar, text)
        for word in (getattr(param, "help", None) or "").split():
            if "-" in word.strip("-"):  # `--sasl-username's`, never broken at a hyphen
                assert word in text, (word, text)


@pytest.mark.parametrize("where", WHERE)
@pytest.mark.parametrize("path", list(GROUPS), ids=[" ".join(p) or "kafkatunnel" for p in GROUPS])
def test_a_group_lists_each_of_its_commands_by_its_first_sentence(
    path: tuple[str, ...], where: str
) -> None:
    listing = _listing(_help(where, path))
    helps = _listed(GROUPS[path])
    assert list(listing) == list(helps), listing
    for name, lines in listing.items():
        assert _sentence(helps[name]) in " ".join(lines), (name, lines)


@pytest.mark.parametrize("where", WHERE)
@pytest.mark.parametrize("path", list(HELPS), ids=[" ".join(p) or "kafkatunnel" for p in HELPS])
def test_a_help_says_its_first_sentence_whole(path: tuple[str, ...], where: str) -> None:
    assert _sentence(HELPS[path]) in _normalised(_help(where, path))


@pytest.mark.parametrize("where", WHERE)
@pytest.mark.parametrize("path", list(HELPS), ids=[" ".join(p) or "kafkatunnel" for p in HELPS])
def test_no_line_of_help_ends_where_its_next_word_had_room(
    path: tuple[str, ...], where: str
) -> None:
    text = _help(where, path)
    paragraphs = _description(text)
    width = max(len(line) for paragraph in paragraphs for line in paragraph)
    odd = [said for paragraph in paragraphs for said in _ends_with_room(paragraph, width)]
    if path in GROUPS:
        rows = _listing(text)
        width = max(len(line) for lines in rows.values() for line in lines)
        odd += [f"{name}: {said}" for name, lines in rows.items()
                for said in _ends_with_room(lines, width)]  # fmt: skip
    assert not odd, "\n".join([*odd, text])


@pytest.mark.parametrize("where", UNWRAPPED)
@pytest.mark.parametrize("path", list(HELPS), ids=[" ".join(p) or "kafkatunnel" for p in HELPS])
def test_where_nothing_needs_wrapping_a_first_paragraph_is_one_line(
    path: tuple[str, ...], where: str
) -> None:
    paragraph = _paragraph(HELPS[path])
    assert any(paragraph in line for line in _help(where, path).splitlines()), paragraph
    if path:
        listed = _listing(_help(where, path[:-1]))[path[-1]]
        assert listed == [paragraph], listed


@pytest.mark.parametrize("where", WHERE)
def test_doctors_help_keeps_with_no_tunnel_running_on_one_line(where: str) -> None:
    for text in (_help(where, ("doctor",)), _help(where, ())):
        assert any("With no tunnel running" in line for line in text.splitlines()), text


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
