"""`kafkatunnel run [UP OPTIONS] -- CMD [ARGS...]`: one line for a shell, an IDE or CI.

The tunnel is started as `up` would start it with the same options (or a running tunnel
that reaches the same cluster is joined, and left running), CMD runs once the tunnel
serves, with the tunnel's client settings in its environment (kafkatunnel/client_settings.py),
and `run` exits with CMD's status after stopping what it started. A tunnel that cannot
start: exit 2 and what it said, CMD never run. Ctrl-C reaches CMD (its process group is
the terminal's), and `run` waits for it; SIGTERM and SIGHUP sent to `run` are passed on.
A tunnel that fails while CMD runs is said on stderr; CMD runs on.
"""

from __future__ import annotations

import contextlib
import difflib
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import typer
from typer.core import TyperCommand

from kafkatunnel.cli.background import STOP_TIMEOUT, Started, start_in_background
from kafkatunnel.cli.env import settings_files
from kafkatunnel.cli.output import error
from kafkatunnel.cli.up_options import check
from kafkatunnel.client_settings import SettingsError, client_settings, environment
from kafkatunnel.pids import pid_alive
from kafkatunnel.tunnel.control import fetch, running_tunnels

PASSED_ON = (signal.SIGTERM, signal.SIGHUP)  # sent to `run` itself: CMD gets them too
LEFT_TO_CMD = (signal.SIGINT, signal.SIGQUIT)  # the terminal sends them to CMD as well
WATCH_EVERY = 0.5  # seconds between looks at a joined tunnel's pid


@dataclass(frozen=True)
class Invocation:
    """`run`'s command line, split: the global options, `up`'s and CMD."""

    global_args: list[str]
    up_args: list[str]
    command: list[str]


def run(
    ctx: typer.Context,
    verify: bool = typer.Option(
        False,
        "--verify",
        help="After CMD, judge what it did: `verify --strict` on the --record directory; "
        "exit non-zero when CMD or the verdict failed, saying which.",
    ),
) -> None:
    """Run a command with the tunnel up and its Kafka settings: run [UP OPTIONS] -- CMD."""
    up = ctx.parent.command.commands["up"] if ctx.parent else None  # type: ignore[attr-defined]
    assert isinstance(up, TyperCommand)
    invocation = split(ctx, up)
    if not invocation.command:
        raise typer.BadParameter("give the command to run after --: run [UP OPTIONS] -- CMD")
    parsed = up.make_context("up", list(invocation.up_args), parent=ctx.parent)
    from kafkatunnel.cli.tunnel import up_options

    options = up_options(parsed.params)
    check(options)  # a wrong flag is said before anything starts
    if verify and options.record.directory is None:
        raise typer.BadParameter("judges the recording: give --record DIR too",
                                 param_hint="--verify")  # fmt: skip
    record = options.record.directory
    code = run_command(invocation, options.target(), verify_dir=record if verify else None,
                       join=record is None)  # fmt: skip
    raise typer.Exit(code)


def split(ctx: typer.Context, up: TyperCommand) -> Invocation:
    """The global options (for the tunnel's own command line), `up`'s options and CMD out
    of `run`'s arguments: click hands them over as they came, but for the `--` before CMD,
    so CMD starts at the first word that is neither one of up's options nor its value."""
    takes_value = {}
    for param in up.params:
        flag = getattr(param, "is_flag", False) or getattr(param, "count", False)
        for opt in [*getattr(param, "opts", []), *getattr(param, "secondary_opts", [])]:
            takes_value[opt] = not flag
    words, up_args = list(ctx.args), []
    while words:
        word = words[0]
        name = word.split("=", 1)[0]
        if name not in takes_value:
            break
        up_args.append(words.pop(0))
        if takes_value[name] and "=" not in word and words:
            up_args.append(words.pop(0))
    if words and words[0].startswith("-"):  # no command starts so: a mistyped option
        name = words[0].split("=", 1)[0]
        close = difflib.get_close_matches(name, list(takes_value), n=3)
        hint = f" (did you mean {' or '.join(close)}?)" if close else ""
        raise typer.BadParameter(f"no such option of up: {name}{hint}", ctx)
    parent = ctx.parent.params if ctx.parent else {}
    global_args = []
    if parent.get("config_file"):
        global_args += ["--config", str(parent["config_file"])]
    if parent.get("profile"):
        global_args += ["--profile", str(parent["profile"])]
    return Invocation(global_args, up_args, words)


def run_command(
    invocation: Invocation, target: dict[str, str], *, verify_dir: Path | None, join: bool
) -> int:
    """The library side of `run`: CMD's exit status (128+N for a death by signal N), or
    verify's when CMD succeeded and the verdict did not."""
    joined = _joinable(target) if join else None
    started: Started | None = None
    if joined is None:
        started = start_in_background(
            [*invocation.global_args, "up", *invocation.up_args, "--no-table"], with_parent=True
        )
        status, pid = started.status, started.process.pid
    else:
        status, pid = joined, int(joined["pid"])
        say(f"joined the running tunnel (pid {pid}) at {status['bootstrap_servers']}; "
            "it keeps running after the command")  # fmt: skip
    try:
        with _settings_environment(status) as env:
            code = _run_watched(invocation.command, env, started, pid)
    finally:
        if started is not None:
            _stop(started)
    if verify_dir is None:
        return code
    verdict = subprocess.run([sys.executable, "-m", "kafkatunnel", "verify", "--strict",
                              str(verify_dir)], check=False).returncode  # fmt: skip
    if code != 0:
        say(f"the command failed ({code}); verify: {'ok' if verdict == 0 else 'failed'}")
        return code
    if verdict != 0:
        say(f"the command succeeded; verify failed ({verdict}): see its report above")
    return verdict


def say(message: str) -> None:
    print(f"kafkatunnel run: {message}", file=sys.stderr, flush=True)


def _joinable(target: dict[str, str]) -> dict[str, Any] | None:
    """The status of a running tunnel of this user's that reaches `target`, if any."""
    for state in running_tunnels().values():
        with contextlib.suppress(OSError, ValueError):
            status = json.loads(fetch(state["control"], "/status"))
            if status.get("target") == target:
                return dict(status)
    return None


@contextlib.contextmanager
def _settings_environment(status: dict[str, Any]) -> Iterator[dict[str, str]]:
    """This environment and the tunnel's client settings, with their files in a directory
    only the user may read, gone after."""
    directory = Path(tempfile.mkdtemp(prefix="kafkatunnel-run-"))
    try:
        try:
            settings = client_settings(status)
        except SettingsError as cause:
            error(str(cause))
            raise typer.Exit(2) from None
        files = settings_files(directory, "tunnel", settings)
        yield {**os.environ, **environment(settings, files)}
    finally:
        shutil.rmtree(directory, ignore_errors=True)


def _run_watched(
    command: Sequence[str], env: dict[str, str], started: Started | None, pid: int
) -> int:
    try:
        child = subprocess.Popen(list(command), env=env)
    except OSError as cause:
        error(f"cannot run {command[0]}: {cause.strerror or cause}",
              "check the command after --: is it installed and on PATH?")  # fmt: skip
        return 127 if isinstance(cause, FileNotFoundError) else 126
    previous = {sig: signal.signal(sig, lambda number, _frame: _pass_on(child, number))
                for sig in PASSED_ON}  # fmt: skip
    previous |= {sig: signal.signal(sig, signal.SIG_IGN) for sig in LEFT_TO_CMD}
    done = threading.Event()
    watcher = threading.Thread(target=_watch, args=(started, pid, done), daemon=True)
    watcher.start()
    try:
        code = child.wait()
    finally:
        done.set()
        for sig, handler in previous.items():
            signal.signal(sig, handler)
    return 128 - code if code < 0 else code


def _pass_on(child: subprocess.Popen[bytes], number: int) -> None:
    with contextlib.suppress(ProcessLookupError):
        child.send_signal(number)


def _watch(started: Started | None, pid: int, done: threading.Event) -> None:
    """Say on stderr when the tunnel ends while the command runs (its clients see the
    connection errors they would see anyway); the command runs on."""
    while not done.wait(WATCH_EVERY):
        if started is not None and started.process.poll() is not None:
            tail = started.log.read_text(errors="replace").strip().splitlines()[-5:]
            say(f"the tunnel exited ({started.process.returncode}) while the command runs; "
                f"its log ({started.log}) ends:\n" + "\n".join(tail))  # fmt: skip
            return
        if started is None and not pid_alive(pid):
            say(f"the tunnel the command uses (pid {pid}) has stopped")
            return


def _stop(started: Started) -> None:
    """The tunnel `run` started, stopped (SIGTERM: it closes cleanly); its log kept only
    when it ended badly."""
    process = started.process
    if process.poll() is None:
        process.terminate()
        try:
            process.wait(timeout=STOP_TIMEOUT)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()
    if process.returncode in (0, -signal.SIGTERM):
        started.log.unlink(missing_ok=True)
    else:
        say(f"the tunnel ended with {process.returncode}: its log is {started.log}")
