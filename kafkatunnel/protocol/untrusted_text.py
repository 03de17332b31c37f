"""Text another party wrote (a broker's error message or mechanisms, a SCRAM server's
error, an identity provider's description) on its way to a log line, status or a
terminal: one line of printable characters, cut short. A server that is not the cluster's,
or a broken one, must not be able to write escape sequences to the user's terminal or
fill the log."""

from __future__ import annotations

MAX_SHOWN = 300  # characters of someone else's text shown


def one_line(value: object, limit: int = MAX_SHOWN) -> str:
    """`value` (str or bytes, UTF-8 with errors replaced) with every character that is not
    printable made a space, the spaces at its ends dropped, and cut to `limit` characters
    ("..." marks the cut); "" for anything else."""
    if isinstance(value, bytes | bytearray):
        value = bytes(value).decode("utf-8", "replace")
    if not isinstance(value, str):
        return ""
    text = "".join(c if c.isprintable() else " " for c in value).strip()
    return text if len(text) <= limit else text[: max(limit - 3, 0)] + "..."
