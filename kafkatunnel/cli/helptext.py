"""--help that lists everything whole, wherever it goes. Piped (a CI log, `| less`): plain
text, no line of it wrapped or cut. On a terminal: Rich's panels at the terminal's width,
unless Rich would cut a word there to fit it (a flag's name, on 80 columns): then plain
text at that width, wrapped between words only. Either way a group lists its commands,
each by its help's first paragraph on one line."""

from __future__ import annotations

import contextlib
import inspect
import io
import sys
import textwrap
import types
from collections.abc import Sequence
from typing import IO, Any

import typer
from typer.core import TyperCommand, TyperGroup

CUT = "\N{HORIZONTAL ELLIPSIS}"  # what Rich ends a word with when it cut the rest
COLUMN_MAX, SPACING = 30, 2  # click's layout of a definition list, kept


def prepare_help(command: TyperCommand | TyperGroup, plain: bool) -> None:
    """Give `command` help so (plain: for a pipe, with a width nothing reaches)."""
    if not command.short_help:
        command.short_help = first_paragraph(command.help or "")
    command.format_options = types.MethodType(_options_by_panel, command)  # type: ignore[method-assign]
    if plain:
        command.rich_markup_mode = None
        command.format_help = types.MethodType(_plain_help, command)  # type: ignore[method-assign]
    else:
        command.format_help = types.MethodType(_help_that_fits, command)  # type: ignore[method-assign]


def first_paragraph(help_text: str) -> str:
    """What a group lists for a command: its help's first paragraph on one line. Rich
    keeps the docstring's line breaks there (mid-sentence, wherever the source wrapped),
    and click, left to itself, lists the first sentence only."""
    return " ".join(inspect.cleandoc(help_text).split("\n\n")[0].split())


class _HeldBack(io.StringIO):
    """Rich's help, held back until it is known to fit: laid out, and coloured, as for the
    stream it stands for (Rich takes the width from the standard streams themselves)."""

    def __init__(self, stream: IO[str]) -> None:
        super().__init__()
        self.stream = stream

    def isatty(self) -> bool:
        return self.stream.isatty()


def _help_that_fits(self: TyperCommand | TyperGroup, ctx: typer.Context, formatter: Any) -> None:
    """Rich's help at the terminal's width, unless Rich would cut a word to fit it there
    (`--sasl-token-endpoint-insec…`): then plain text at that width."""
    held = _HeldBack(sys.stdout)
    with contextlib.redirect_stdout(held):
        type(self).format_help(self, ctx, formatter)  # type: ignore[arg-type]
    if CUT not in held.getvalue():
        sys.stdout.write(held.getvalue())
        return
    markup, self.rich_markup_mode = self.rich_markup_mode, None
    try:
        _plain_help(self, ctx, formatter)
    finally:
        self.rich_markup_mode = markup


def _plain_help(self: TyperCommand | TyperGroup, ctx: typer.Context, formatter: Any) -> None:
    """click's plain help, its text wrapped between words only: click would break
    `--sasl-username` at a hyphen and cut a word longer than the column."""
    formatter.write_text = types.MethodType(_write_text, formatter)
    formatter.write_dl = types.MethodType(_write_dl, formatter)
    type(self).format_help(self, ctx, formatter)  # type: ignore[arg-type]


def _options_by_panel(self: TyperCommand | TyperGroup, ctx: typer.Context, formatter: Any) -> None:
    """Plain help's options, a section per panel as Rich shows them (`up` has a dozen),
    then a group's commands, as the format_options this replaces lists them."""
    sections: dict[str, list[tuple[str, str]]] = {}
    for param in self.get_params(ctx):
        record = param.get_help_record(ctx)
        if record is not None:
            panel = getattr(param, "rich_help_panel", None) or "Options"
            sections.setdefault(panel, []).append(record)
    for title, records in sections.items():
        with formatter.section(title):
            formatter.write_dl(records)
    if isinstance(self, TyperGroup):
        self.format_commands(ctx, formatter)


def _wrapped(text: str, width: int) -> list[str]:
    """Lines of at most `width` characters, broken between words only (a word longer
    than that has a line of its own), paragraphs apart by an empty line."""
    lines: list[str] = []
    for paragraph in inspect.cleandoc(text).split("\n\n"):
        if lines:
            lines.append("")
        lines += textwrap.wrap(paragraph, max(width, 1), break_long_words=False,
                               break_on_hyphens=False) or [""]  # fmt: skip
    return lines


def _write_text(self: Any, text: str) -> None:
    indent = " " * self.current_indent
    lines = _wrapped(text, self.width - self.current_indent)
    self.write("\n".join(indent + line if line else "" for line in lines) + "\n")


def _write_dl(
    self: Any, rows: Sequence[tuple[str, str]], col_max: int = COLUMN_MAX,
    col_spacing: int = SPACING,
) -> None:  # fmt: skip
    """click's definition list (a column of names, their help beside them), wrapped so."""
    first_col = min(max((len(first) for first, _ in rows), default=0), col_max) + col_spacing
    beside = " " * (first_col + self.current_indent)
    for first, second in rows:
        self.write(" " * self.current_indent + first)
        if not second:
            self.write("\n")
            continue
        if len(first) <= first_col - col_spacing:
            self.write(" " * (first_col - len(first)))
        else:
            self.write("\n" + beside)
        lines = _wrapped(second, max(self.width - first_col - 2, 10))
        self.write(lines[0] + "\n")
        for line in lines[1:]:
            self.write((beside + line if line else "") + "\n")
