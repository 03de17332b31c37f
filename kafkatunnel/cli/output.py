"""Where the command line's output goes, and how it fits there.

On a terminal, Rich uses the terminal's width. Anywhere else (a CI log, a pipe, a file) a
line is never cut: Rich's fallback of 80 columns would truncate table cells and wrap
borders into the next line, so consoles that do not write to a terminal get a width no line
reaches, and help falls back to plain text. `COLUMNS` still wins when set.
"""

from __future__ import annotations

import io
import logging
import os
import sys
from typing import IO

from rich.console import Console
from rich.logging import RichHandler
from rich.markup import escape

UNBOUNDED = 100_000  # wider than any line we print: nothing is cut or wrapped


def fits_terminal(stream: IO[str]) -> bool:
    """Whether Rich should lay out for `stream`'s own width (a terminal, or COLUMNS set)."""
    return stream.isatty() or os.environ.get("COLUMNS", "").isdigit()


def make_console(stderr: bool = False) -> Console:
    stream = sys.stderr if stderr else sys.stdout
    if fits_terminal(stream):
        return Console(stderr=stderr)
    return Console(stderr=stderr, width=UNBOUNDED)


def error(message: str, fix: str | None = None) -> None:
    """One error on standard error: the cause, then what to do about it."""
    text = f"[red]error:[/] {escape(message)}"
    if fix:
        text += f"\n[bold]fix:[/] {escape(fix)}"
    make_console(stderr=True).print(text, highlight=False)


def prepare_errors() -> None:
    """Import now what printing an error (and encoding a name) would import on first use:
    after a drop of privileges the files may be out of reach, and an error path that
    fails to import ends in a traceback instead of its message."""
    import encodings.idna  # noqa: F401  (socket's host names)

    Console(file=io.StringIO(), width=UNBOUNDED).print("[red]error:[/] :x: text", highlight=False)


def warning(message: str) -> None:
    """A warning on standard error: something was not done, and why."""
    make_console(stderr=True).print(f"[yellow]warning:[/] {escape(message)}", highlight=False)


def configure_logging(verbose: int, quiet: bool) -> None:
    level = (
        logging.ERROR if quiet else (logging.WARNING, logging.INFO, logging.DEBUG)[min(verbose, 2)]
    )
    handler: logging.Handler
    if sys.stderr.isatty():
        handler = RichHandler(console=Console(stderr=True), show_path=False)
        handler.setFormatter(logging.Formatter("%(name)s: %(message)s"))
    else:  # a log file or a pipe: one line per record
        handler = logging.StreamHandler()
        handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s"))
    logging.basicConfig(level=level, handlers=[handler], force=True)


def debugging() -> bool:
    """-vv was given: errors may carry their traceback (for bug reports)."""
    return logging.getLogger().isEnabledFor(logging.DEBUG)
