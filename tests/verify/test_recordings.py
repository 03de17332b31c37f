"""Verifying the recordings committed under tests/data: a routed session (tunnel, rotated
into five files) verifies ok; the single-forward capture (dumpcap, no tunnel) fails, naming
the groups and their NOT_COORDINATOR counts; Apache Kafka 4.4 with a group of every kind
verifies ok, each with its type. Spark and the in-process pass agree."""

from __future__ import annotations

import contextlib
import errno
import json
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import pytest

from kafkatunnel.capture.recorder import Listener
from kafkatunnel.verify.calls import FileDecoder
from kafkatunnel.verify.job import PARALLEL_BYTES, Report, cores, verify_local, verify_spark
from kafkatunnel.verify.judge import MISROUTED, OK
from kafkatunnel.waiting import wait_for
from tests.verify.conftest import GROUP_KINDS, ROUTED, SINGLE_FORWARD
from tests.worlds.copies import read_sample, record_copies, tag_for


def _by_kind(report: Report, key_type: int) -> dict[str, Any]:
    return {v.key: v for v in report.verdicts if v.key_type == key_type}


def test_the_routed_session_verifies_ok() -> None:
    report = verify_local([str(ROUTED)])
    assert report.ok and report.leaks == [] and report.problems == []
    assert report.files == 5 and report.tunnel_recording
    groups = _by_kind(report, 0)
    assert len(groups) == 6 and all(v.verdict == OK for v in groups.values())
    assert {v.coordinator for v in groups.values()} == {1, 2, 3}
    assert all(v.errors["NOT_COORDINATOR"] == 0 and v.checked >= 3 for v in groups.values())
    transactions = [v for v in _by_kind(report, 1).values() if v.verdict == OK]
    assert {v.coordinator for v in transactions} == {1, 2, 3}


def test_every_kind_of_group_verifies_ok_with_its_type() -> None:
    """Apache Kafka 4.4 through `up --record`: a classic, a consumer, a share and a streams
    group (Kafka Streams, exactly once) and transactional ids, each judged by its own
    coordinator-scoped requests."""
    report = verify_local([str(GROUP_KINDS)])
    assert report.ok and report.leaks == [] and report.problems == [], report.problems
    groups = _by_kind(report, 0)
    assert all(v.verdict == OK and v.checked >= 1 for v in groups.values()), groups
    # scripts/record_group_kinds.py names each group after its kind: kinds-XXXX-<kind>
    kinds = {"classic", "consumer", "share", "streams"}
    typed = {k.rsplit("-", 1)[1]: v.group_type for k, v in groups.items()
             if k.rsplit("-", 1)[1] in kinds}  # fmt: skip
    assert typed == {kind: kind for kind in kinds}, groups
    transactions = _by_kind(report, 1)
    assert len(transactions) >= 2 and all(v.verdict == OK for v in transactions.values())
    # The first transactional id of the new cluster created __transaction_state: broker 0,
    # named and reached (the listener says so), answered NOT_COORDINATOR until it had loaded
    # it. A broker not ready, not an address leading elsewhere.
    loading = [v for v in transactions.values() if v.errors["NOT_COORDINATOR"] >= 3]
    assert loading and all("not ready yet" in " ".join(v.reasons) for v in loading), loading


def test_calls_split_by_rotation_are_joined_across_files() -> None:
    files = sorted(ROUTED.iterdir())
    alone = sum(len([c for c in FileDecoder(str(f), f.read_bytes()).run().calls
                     if c.response_ts is not None]) for f in files)  # fmt: skip
    assert verify_local([str(ROUTED)]).calls > alone


def test_the_single_forward_capture_fails_naming_each_misrouted_group() -> None:
    report = verify_local([str(SINGLE_FORWARD)])
    assert not report.ok and not report.tunnel_recording
    groups = _by_kind(report, 0)
    misrouted = {k: v for k, v in groups.items() if v.verdict == MISROUTED}
    fine = {k: v for k, v in groups.items() if v.verdict == OK}
    assert len(misrouted) == 4 and len(fine) == 2
    (forwarded,) = {v.coordinator for v in fine.values()}  # the one broker forwarded to
    for verdict in misrouted.values():
        assert verdict.coordinator != forwarded
        assert verdict.errors["NOT_COORDINATOR"] >= 1
        assert any("NOT_COORDINATOR" in reason for reason in verdict.reasons)


def test_spark_and_the_single_process_pass_give_the_same_verdicts(spark: Any) -> None:
    for path in (ROUTED, SINGLE_FORWARD, GROUP_KINDS):
        local, distributed = verify_local([str(path)]), verify_spark([str(path)], spark)
        assert distributed.as_dict() == local.as_dict()


def _cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "kafkatunnel", "verify", *args],
        capture_output=True, text=True, timeout=300,
    )  # fmt: skip


def test_cli_exit_codes_and_reports(tmp_path: Path) -> None:
    ok = _cli("--in-process", str(ROUTED), "--json", str(tmp_path / "ok.json"),
              "--html", str(tmp_path / "ok.html"))  # fmt: skip
    assert ok.returncode == 0, ok.stdout + ok.stderr
    assert "verify: ok" in ok.stdout
    assert json.loads((tmp_path / "ok.json").read_text())["ok"] is True
    page = (tmp_path / "ok.html").read_text()
    assert page.startswith("<!doctype html>") and "<svg" in page and "JoinGroup" in page
    assert "http://" not in page and "https://" not in page  # self-contained
    failed = _cli("--in-process", str(SINGLE_FORWARD), "--json", "-")
    assert failed.returncode == 1
    assert json.loads(failed.stdout)["ok"] is False  # standard output: the JSON alone
    assert "verify: FAILED" in failed.stderr
    assert "misrouted" in failed.stderr


def test_cli_names_the_problem_with_bad_paths(tmp_path: Path) -> None:
    missing = _cli("--in-process", str(tmp_path / "nothing-here"))
    assert missing.returncode == 2 and "no recording at" in missing.stderr
    (tmp_path / "notes.txt").write_text("hello")
    empty = _cli("--in-process", str(tmp_path))
    assert empty.returncode == 2 and "no .pcap or .pcapng files" in empty.stderr
    (tmp_path / "junk.pcap").write_bytes(b"GET / HTTP/1.1\r\n\r\n")
    junk = _cli("--in-process", str(tmp_path / "junk.pcap"))
    assert junk.returncode == 1 and "not a pcap or pcapng file" in junk.stdout
    assert "1 file(s) could not be read as captures" in junk.stdout


def test_without_java_verify_says_what_to_install(tmp_path: Path) -> None:
    """PATH without java: the message names Java 17 and the way around it."""
    import os

    env = {**os.environ, "PATH": str(Path(sys.executable).parent)}
    env.pop("JAVA_HOME", None)
    out = subprocess.run(
        [sys.executable, "-m", "kafkatunnel", "verify", str(ROUTED)],
        capture_output=True, text=True, timeout=120, env=env,
    )  # fmt: skip
    assert out.returncode == 2
    text = " ".join((out.stdout + out.stderr).split())
    assert "Spark needs Java 17 or newer" in text and "--in-process" in text


MISROUTED_COPY = 7


@pytest.fixture(scope="module")
def copies(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """120 copies of the routed session, 24 MiB in 6 files, copy 7 misrouted: enough for
    verify to spread the files over processes."""
    directory = tmp_path_factory.mktemp("copies")
    sample = read_sample(sorted(ROUTED.iterdir()))
    tags = [tag_for(copy, sample.prefix) for copy in range(120)]

    def misroute(tag: bytes, listener: Listener) -> Listener:
        if tag != tags[MISROUTED_COPY] or listener.node_id is None:
            return listener
        return Listener(listener.node_id % 3 + 1, listener.advertised, listener.tunnel)

    record_copies(directory, sample, tags, relisten=misroute, rotate_bytes=4 * 2**20)
    files = sorted(directory.iterdir())
    assert len(files) > 2 and sum(f.stat().st_size for f in files) > PARALLEL_BYTES
    return directory


def test_a_process_per_core_gives_the_one_process_verdicts(copies: Path) -> None:
    """Without Spark, files are spread over processes once there is enough to share: the
    report is the one a single process writes, from forked workers and, while another
    thread runs (forking it is not safe), from the fork server's."""
    spread = verify_local([str(copies)], workers=2)
    alone = verify_local([str(copies)], workers=1)
    assert spread.as_dict() == alone.as_dict()
    other = threading.Event()
    waiting = threading.Thread(target=other.wait)
    waiting.start()
    try:
        served = verify_local([str(copies)], workers=2)
    finally:
        other.set()
        waiting.join()
    assert served.as_dict() == alone.as_dict()
    assert spread.frames > 100_000 and not spread.ok
    misrouted = {v.key for v in spread.verdicts if v.verdict == MISROUTED}
    tag = tag_for(MISROUTED_COPY, read_sample(sorted(ROUTED.iterdir())).prefix).decode()
    assert misrouted and all(key.startswith(tag) for key in misrouted)


def _descendants(root: int) -> set[int]:
    """The processes under `root`, from /proc (forked workers, or the fork server's)."""
    parents: dict[int, int] = {}
    for stat in Path("/proc").glob("[0-9]*/stat"):
        with contextlib.suppress(OSError, ValueError, IndexError):
            parents[int(stat.parent.name)] = int(stat.read_text().rsplit(")", 1)[1].split()[1])
    found: set[int] = set()
    frontier = {root}
    while frontier:
        frontier = {pid for pid, parent in parents.items() if parent in frontier} - found
        found |= frontier
    return found


def _holds(pid: int, path: Path) -> bool:
    with contextlib.suppress(OSError):
        return any(os.readlink(fd) == str(path) for fd in Path(f"/proc/{pid}/fd").iterdir())
    return False


def _reader(root: int, path: Path) -> int | None:
    """The one process under `root` that has `path` open, if any."""
    readers = [pid for pid in _descendants(root) if _holds(pid, path)]
    assert len(readers) <= 1, readers
    return readers[0] if readers else None


def _writer_once_read(fifo: Path, process: subprocess.Popen[str], deadline: float) -> int:
    """A write end of `fifo`, opened once some process has opened it to read."""
    while True:
        try:
            return os.open(fifo, os.O_WRONLY | os.O_NONBLOCK)
        except OSError as error:
            if error.errno != errno.ENXIO:  # ENXIO: nobody reads it yet
                raise
        assert process.poll() is None, process.communicate()
        assert time.monotonic() < deadline, "nobody opened the file to read it"
        time.sleep(0.05)


def test_a_killed_decoding_process_is_said_and_the_files_decoded_again(
    copies: Path, tmp_path: Path
) -> None:
    """A decoding process killed while it reads a file (as the kernel's out-of-memory killer
    kills): verify says so on stderr, decodes every file again in this one process and
    reports what one process reports. The file is a named pipe, so the test knows which
    process reads it, and when."""
    if cores() < 2:
        pytest.skip("one core: verify decodes in one process, with no process to kill")
    held, content = tmp_path / "held.pcapng", sorted(ROUTED.iterdir())[0].read_bytes()
    os.mkfifo(held)
    target = tmp_path / "report.json"
    process = subprocess.Popen(
        [sys.executable, "-m", "kafkatunnel", "verify", "--in-process", str(held),
         str(copies), "--json", str(target)],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    try:
        writer = _writer_once_read(held, process, time.monotonic() + 120)
        # a reader counts once inside open(), before the file is among its descriptors
        reader = wait_for(lambda: _reader(process.pid, held), timeout=30, what="the reader")
        os.kill(reader, signal.SIGKILL)
        # the write end stays open (closed, a reader would see an empty file): once verify
        # itself opens the file again, the whole recording is written and the end closed
        wait_for(lambda: _holds(process.pid, held), timeout=60, what="verify to read again")
        os.set_blocking(writer, True)
        with os.fdopen(writer, "wb") as pipe:
            pipe.write(content)
        out, err = process.communicate(timeout=300)
    finally:
        process.kill()
        process.wait()
    files = len(list(copies.iterdir())) + 1
    said = " ".join(err.split())
    assert f"a decoding process died (killed, out of memory?): decoding all {files} files" in said
    assert "Traceback" not in err
    assert process.returncode == 1, out + err  # the misrouted copy
    held.unlink()
    held.write_bytes(content)  # the same file, read by one process from the start
    alone = verify_local([str(held), str(copies)], workers=1)
    assert json.loads(target.read_text()) == alone.as_dict()
