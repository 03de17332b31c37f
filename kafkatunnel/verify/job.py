"""The verify job: recordings in, a verdict per group and transactional id out.

Stage 1 decodes each file on its own (a Spark task per file): complete calls become events
at once; calls split across rotated files travel as halves, keyed by connection, and are
joined in stage 2. A few facts (which address is which broker, who leads the internal
topics) are collected and broadcast; stage 3 judges each group from its own events. The
same functions run without Spark in `verify_local`, for small inputs and for comparison.
"""

from __future__ import annotations

import contextlib
import gc
import importlib.util
import os
import shutil
import subprocess
import sys
import threading
from collections import Counter
from collections.abc import Iterable, Iterator, Mapping
from concurrent.futures import ProcessPoolExecutor
from concurrent.futures.process import BrokenProcessPool
from dataclasses import dataclass, field
from multiprocessing import get_context
from pathlib import Path
from typing import TYPE_CHECKING, Any, NamedTuple

from kafkatunnel.capture.pcapng import CaptureFormatError
from kafkatunnel.protocol import api_name, api_title
from kafkatunnel.verify.calls import (
    Call,
    FileDecoder,
    FileSummary,
    Orphan,
    is_dangling,
    pair_halves,
)
from kafkatunnel.verify.events import (
    BROKERS,
    CALL,
    LEADERS,
    LOOKUP,
    MISDIRECTED,
    NAMED,
    PARTITION,
    Event,
    events_of,
)
from kafkatunnel.verify.identity import Identities, Sighting, identify, sightings_of
from kafkatunnel.verify.judge import MISROUTED, Facts, LeaderSnapshot, Verdict, judge

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

MAX_PROBLEMS = 20  # per file: enough to say what is wrong
PARALLEL_BYTES = 16 * 2**20  # below this, starting processes costs more than it saves
Named = Counter[tuple[str, int, str]]  # (address, api key, "tunnel"|"plain") -> times named


@dataclass
class FileResult:
    summary: FileSummary
    events: list[Event] = field(default_factory=list)  # everything but NAMED
    named: Named = field(default_factory=Counter)
    halves: list[Call | Orphan] = field(default_factory=list)

    # Results travel between processes (decoding workers, Spark's cache): events as plain
    # tuples unpickle in C, named tuples through copyreg, a third slower.
    def __getstate__(self) -> dict[str, Any]:
        return {**self.__dict__, "events": [tuple(event) for event in self.events]}

    def __setstate__(self, state: dict[str, Any]) -> None:
        state["events"] = list(map(Event._make, state["events"]))
        self.__dict__.update(state)


def _collect(calls: Iterable[Call], result: FileResult) -> None:
    for call in calls:
        try:
            events = events_of(call)
        except Exception as error:  # kio raises its own errors on bytes it cannot read
            if len(result.summary.problems) < MAX_PROBLEMS:
                result.summary.problems.append(
                    f"{call.conn.key}: {api_name(call.api_key)} v{call.api_version} "
                    f"(correlation {call.correlation_id}) could not be decoded: {error}"
                )
            continue
        for event in events:
            if event.kind == NAMED:
                assert event.address is not None
                scope = "tunnel" if event.conn.tunnel else "plain"
                result.named[(event.address, event.api_key, scope)] += 1
            else:
                result.events.append(event)


def decode_file(source: str, data: bytes | memoryview) -> FileResult:
    """Stage 1: one file's events, and the halves of calls it does not hold whole."""
    with _no_cycle_collection():
        try:
            decoder = FileDecoder(source, data).run()
        except CaptureFormatError as error:
            problems = [f"{source}: {error}"]
            return FileResult(FileSummary(source, unreadable=True, problems=problems))
        result = FileResult(decoder.summary)
        whole: list[Call] = []
        for call in decoder.calls:
            (result.halves.append if is_dangling(call) else whole.append)(call)
        result.halves.extend(decoder.orphans)
        _collect(whole, result)
        return result


@contextlib.contextmanager
def _no_cycle_collection() -> Iterator[None]:
    """Decoding makes millions of objects and no reference cycles: the cyclic collector
    would only walk them, again and again (a million frames in one process: 12.6 s with
    it, 11.8 s without)."""
    enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if enabled:
            gc.enable()


def join_halves(halves: Iterable[Call | Orphan]) -> FileResult:
    """Stage 2, for one connection's halves from all files."""
    result = FileResult(FileSummary("(calls across files)"))
    _collect((c for c in pair_halves(halves) if not is_dangling(c)), result)
    return result


def facts_from(events: Iterable[Event], summaries: Iterable[FileSummary]) -> Facts:
    facts = Facts()
    for summary in summaries:
        for listener in summary.listeners:
            node = listener.get("node_id")
            if isinstance(node, int):
                facts.address_nodes[str(listener["tunnel"])] = node
                facts.address_nodes.setdefault(str(listener["advertised"]), node)
    snapshots: dict[int, list[LeaderSnapshot]] = {}
    for event in sorted(events, key=lambda e: e.ts):
        if event.kind == BROKERS:
            for node, address in event.brokers:
                facts.address_nodes.setdefault(address, node)
                facts.advertised.add((node, address))
        elif event.kind == LOOKUP and event.error == 0 and event.node is not None:
            if event.address is not None and event.node >= 0:
                facts.address_nodes.setdefault(event.address, event.node)
                facts.advertised.add((event.node, event.address))
        elif event.kind == MISDIRECTED and event.node is not None:  # in time order
            key = (event.conn.run, event.node, event.client_id)
            facts.misdirected.setdefault(key, []).append(event.ts)
        elif event.kind == LEADERS:
            by_type: dict[int, dict[int, int]] = {}
            for key_type, partition, leader in event.leaders:
                by_type.setdefault(key_type, {})[partition] = leader
            for key_type, leaders in by_type.items():
                snapshot = LeaderSnapshot(event.ts, max(leaders) + 1, leaders)
                snapshots.setdefault(key_type, []).append(snapshot)
    facts.leaders = snapshots
    return facts


def is_fact(event: Event) -> bool:
    return event.kind in (BROKERS, LEADERS, MISDIRECTED) or (
        event.kind == LOOKUP and event.error == 0
    )


def is_about_a_key(event: Event) -> bool:
    return event.kind in (LOOKUP, CALL) and event.key is not None


@dataclass
class Report:
    verdicts: list[Verdict]
    leaks: list[dict[str, Any]]
    files: int
    frames: int
    calls: int
    tunnel_recording: bool
    problems: list[str]
    unreadable: int = 0  # files that are not captures at all
    sources: list[str] = field(default_factory=list)  # the files read
    addresses: list[dict[str, Any]] = field(default_factory=list)  # server address -> broker

    cut_short: list[str] = field(default_factory=list)  # files that end mid-packet

    @property
    def ok(self) -> bool:
        misrouted = any(v.verdict == MISROUTED for v in self.verdicts)
        return not self.leaks and not misrouted and not self.unreadable

    def nothing_checked(self) -> str | None:
        """Why no group could be checked at all, or None when some was."""
        if any(v.verdict != "unverified" for v in self.verdicts):
            return None
        if not self.verdicts:
            return ("no consumer group or transactional id in the recordings (were they "
                    "made while clients joined groups?)")  # fmt: skip
        return (f"all {len(self.verdicts)} group(s) unverified, each with its reasons: "
                "capture the clients from their start (their FindCoordinator look-ups), or "
                "name the broker behind a captured address with --broker ADDRESS=NODE")  # fmt: skip

    def as_dict(self) -> dict[str, Any]:
        return {
            "ok": self.ok,
            "files": self.files,
            "frames": self.frames,
            "calls": self.calls,
            "tunnel_recording": self.tunnel_recording,
            "unreadable": self.unreadable,
            "nothing_checked": self.nothing_checked(),
            "cut_short": self.cut_short,
            "sources": self.sources,
            "addresses": self.addresses,
            "groups": [v.as_dict() for v in sorted(self.verdicts, key=_order)],
            "leaks": self.leaks,
            "problems": self.problems,
        }


def _order(verdict: Verdict) -> tuple[int, str]:
    return (verdict.key_type, verdict.key)


def leaks_in(named: Named, summaries: list[FileSummary]) -> list[dict[str, Any]]:
    """Addresses client-facing answers named that are not the tunnel's own."""
    allowed = set()
    for summary in summaries:
        for listener in summary.listeners:
            allowed.add(str(listener["tunnel"]))
            if listener.get("mode") == "transparent":
                allowed.add(str(listener["advertised"]))
    leaks = [
        {"address": address, "api": api_title(api), "times": times}
        for (address, api, scope), times in sorted(named.items())
        if scope == "tunnel" and address not in allowed
    ]
    return leaks


def _report(
    verdicts: list[Verdict],
    named: Named,
    summaries: list[FileSummary],
    calls: int,
    facts: Facts,
) -> Report:
    real = [s for s in summaries if s.source != "(calls across files)"]
    problems = [p for s in summaries for p in s.problems]
    name_clients_keys(verdicts, summaries)
    identities = facts.identities.addresses.values() if facts.identities else []
    return Report(
        verdicts=verdicts,
        leaks=leaks_in(named, summaries),
        files=len(real),
        frames=sum(s.frames for s in real),
        calls=calls,
        tunnel_recording=any(s.tunnel for s in real),
        problems=problems,
        unreadable=sum(s.unreadable for s in real),
        sources=[_local_name(s.source) for s in real],
        cut_short=[
            f"{_local_name(s.source)} at byte {s.cut_short}"
            for s in real
            if s.cut_short is not None
        ],
        addresses=[i.as_dict(_start(verdicts)) for i in identities],
    )


def _local_name(source: str) -> str:
    """A local file as its path (Spark names it file:/...); other URIs as they are."""
    if source.startswith("file:"):
        from urllib.parse import unquote, urlparse

        return unquote(urlparse(source).path)
    return source


def name_clients_keys(verdicts: Iterable[Verdict], summaries: Iterable[FileSummary]) -> None:
    """Each verdict on an isolated id (a recording of `up --isolate`: NAME.SUFFIX on the
    cluster, judged as such, since its coordinator is its own) learns the NAME its client
    used."""
    tails = {f".{listener['isolate']}" for summary in summaries for listener in summary.listeners
             if isinstance(listener.get("isolate"), str) and listener["isolate"]}  # fmt: skip
    for verdict in verdicts:
        for tail in tails:
            if verdict.key.endswith(tail) and len(verdict.key) > len(tail):
                verdict.client_key = verdict.key[: -len(tail)]


def _start(verdicts: list[Verdict]) -> int:
    """The first moment any group's timeline starts from (0 when nothing was recorded)."""
    return min((v.start for v in verdicts if v.timeline), default=0)


def is_uri(path: str) -> bool:
    """A Hadoop filesystem URI (hdfs://, s3a://...), which only Spark reads."""
    return "://" in path and not path.startswith("file://")


def expand(paths: Iterable[str]) -> list[str]:
    """Local files and directories to files; other URIs (hdfs://, s3a://) pass as given."""
    out: list[str] = []
    for path in paths:
        if is_uri(path):
            out.append(path)
            continue
        local = Path(path.removeprefix("file://"))
        if local.is_dir():
            # .pcap, .pcapng, and tcpdump -C's rotated file.pcap1, file.pcap2..., in
            # subdirectories too (rotated recordings kept per day or per run)
            out.extend(str(p) for p in sorted(local.rglob("*"))
                       if ".pcap" in p.name and p.is_file())  # fmt: skip
        elif local.exists():
            out.append(str(local))
        else:
            raise FileNotFoundError(f"no recording at {path}")
    return out


def fact_digest(events: Iterable[Event]) -> list[Event]:
    """The facts among a file's events, small: each (address, node) pair once, at its
    earliest, and every leaders snapshot."""
    first: dict[tuple[str, int], Event] = {}
    out: list[Event] = []
    for event in events:
        if event.kind in (LEADERS, MISDIRECTED):
            out.append(event)
        elif is_fact(event):
            pairs = event.brokers if event.kind == BROKERS else ((event.node, event.address),)
            for node, address in pairs:
                if node is None or node < 0 or address is None:
                    continue
                seen = first.get((address, node))
                if seen is None or event.ts < seen.ts:
                    first[(address, node)] = Event(
                        BROKERS, event.ts, event.conn, event.api_key, brokers=((node, address),)
                    )
    return out + list(first.values())


class Meta(NamedTuple):
    """What the driver needs of a file's result: all but its events about groups."""

    summary: FileSummary
    named: Named
    facts: list[Event]  # the digest of the events that are facts (see fact_digest)
    halves: list[Call | Orphan]  # calls cut by the file's end, to join across files


def meta_of(result: FileResult) -> Meta:
    return Meta(result.summary, result.named, fact_digest(result.events), result.halves)


def keyed_events(result: FileResult) -> list[tuple[tuple[str, int], Event]]:
    return [((str(e.key), e.key_type), e) for e in result.events if is_about_a_key(e)]


def keyed_rows(result: FileResult) -> list[tuple[tuple[str, int], tuple[Any, ...]]]:
    """keyed_events with each event as a plain tuple: Spark's shuffle pickles every one,
    and plain tuples unpickle in C (Event._make turns them back)."""
    return [(key, tuple(event)) for key, event in keyed_events(result)]


@dataclass
class Gathered:
    """The driver's side of the job: facts and calls split across files, joined."""

    summaries: list[FileSummary]
    named: Named
    facts: Facts
    joined: list[FileResult]

    @property
    def plain(self) -> bool:
        """Whether any connection was captured without a kafkatunnel listener (whose
        server address only behaviour, DNS or the user can identify)."""
        return any(summary.servers for summary in self.summaries)


def gather(metas: Iterable[Meta]) -> Gathered:
    summaries: list[FileSummary] = []
    named: Named = Counter()
    fact_events: list[Event] = []
    halves: dict[str, list[Call | Orphan]] = {}
    for summary, file_named, facts, file_halves in metas:
        summaries.append(summary)
        named.update(file_named)
        fact_events.extend(facts)
        for half in file_halves:
            halves.setdefault(half.conn.key, []).append(half)
    joined = [join_halves(h) for h in halves.values()]
    for result in joined:
        summaries.append(result.summary)
        named.update(result.named)
        fact_events.extend(fact_digest(result.events))
    return Gathered(summaries, named, facts_from(fact_events, summaries), joined)


def identify_brokers(
    gathered: Gathered, sightings: Iterable[Sighting], user: Mapping[str, int] | None
) -> Identities:
    """Which broker is behind each address the recordings' connections went to."""
    servers: set[str] = set()
    recorded: dict[str, int] = {}
    dns = []
    for summary in gathered.summaries:
        servers |= summary.servers
        dns.extend(summary.dns)
        for listener in summary.listeners:
            node = listener.get("node_id")
            if isinstance(node, int):
                recorded[str(listener["tunnel"])] = node
    return identify(servers | set(recorded), recorded=recorded,
                    advertised=gathered.facts.advertised, dns=dns, sightings=sightings,
                    user=user)  # fmt: skip


def decode_path(path: str) -> FileResult:
    return decode_file(path, Path(path).read_bytes())


def cores() -> int:
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1


WORKER_DIED = (
    "verify: a decoding process died (killed, out of memory?): decoding all {files} files "
    "again in this one process, which takes longer; give the machine more memory, or verify "
    "on Spark (without --in-process)"
)


def decode_all(files: list[str], workers: int | None = None) -> list[FileResult]:
    """Stage 1 without Spark: each file on its own, in a process per core when there is
    enough to share (forked when this process runs no other thread, else from a fork
    server, as forking a threaded process is not safe)."""
    workers = cores() if workers is None else workers
    if workers < 2 or len(files) < 2 or sum(_size(f) for f in files) < PARALLEL_BYTES:
        return [decode_path(f) for f in files]
    method = "fork" if threading.active_count() == 1 else "forkserver"
    try:
        with ProcessPoolExecutor(min(workers, len(files)), get_context(method)) as pool:
            return list(pool.map(decode_path, files))
    except BrokenProcessPool:  # a worker was killed (out of memory?): one process, then
        print(WORKER_DIED.format(files=len(files)), file=sys.stderr, flush=True)
        return [decode_path(f) for f in files]


def _size(path: str) -> int:
    try:
        return Path(path).stat().st_size
    except OSError:
        return 0  # read (and reported) by the decoder


def verify_local(
    paths: Iterable[str], brokers: Mapping[str, int] | None = None, workers: int | None = None
) -> Report:
    """The whole job without Spark: files decoded by `workers` processes (one per core by
    default), judged here. `brokers`: address -> node, from the user."""
    results = decode_all(expand(paths), workers)
    gathered = gather(meta_of(r) for r in results)
    by_key: dict[tuple[str, int], list[Event]] = {}
    for result in results + gathered.joined:
        for key, event in keyed_events(result):
            by_key.setdefault(key, []).append(event)
    sightings = []
    if gathered.plain:
        sightings = [s for group in by_key.values() for s in sightings_of(group)]
    gathered.facts.identities = identify_brokers(gathered, sightings, brokers)
    verdicts = [
        judge(k, t, group, gathered.facts)
        for (k, t), group in by_key.items()
        if t != PARTITION  # partitions tell who is where; groups are what is judged
    ]
    calls = sum(s.calls for s in gathered.summaries)
    return _report(verdicts, gathered.named, gathered.summaries, calls, gathered.facts)


def verify_spark(
    paths: Iterable[str], spark: SparkSession, brokers: Mapping[str, int] | None = None
) -> Report:
    """The job on Spark: any master, any Hadoop filesystem URI. Files are decoded once (a
    task each); the driver gets only facts and the calls split across files; the events
    about groups are shuffled by group; what each group's answers say about the brokers
    behind the addresses comes back (small), and the groups are judged on the executors."""
    sc = spark.sparkContext
    uris = [p if "://" in p else Path(p).resolve().as_uri() for p in expand(paths)]
    files = sc.binaryFiles(",".join(uris), minPartitions=max(len(uris), 1))
    decoded = files.map(lambda item: decode_file(item[0], item[1])).persist()
    gathered = gather(decoded.map(meta_of).collect())
    keyed = decoded.flatMap(keyed_rows)
    extra = [pair for result in gathered.joined for pair in keyed_rows(result)]
    if extra:
        keyed = keyed.union(sc.parallelize(extra))
    grouped = keyed.groupByKey().mapValues(lambda rows: list(map(Event._make, rows)))
    sightings = []
    if gathered.plain:  # only plain connections' addresses need identifying by behaviour
        grouped = grouped.persist()
        sightings = grouped.flatMap(lambda item: sightings_of(item[1])).collect()
    gathered.facts.identities = identify_brokers(gathered, sightings, brokers)
    shared = sc.broadcast(gathered.facts)
    verdicts = (
        grouped.filter(lambda item: item[0][1] != PARTITION)
        .map(lambda item: judge(item[0][0], item[0][1], item[1], shared.value))
        .collect()
    )
    grouped.unpersist()
    decoded.unpersist()
    calls = sum(s.calls for s in gathered.summaries)
    return _report(verdicts, gathered.named, gathered.summaries, calls, gathered.facts)


MIN_JAVA = 17
JAVA_FIX = "install one (Debian/Ubuntu: apt-get install openjdk-17-jre-headless)"


def spark_problem() -> str | None:
    """Why Spark cannot start here, and the fix, or None."""
    if importlib.util.find_spec("pyspark") is None:
        return "PySpark is not installed: install it (pip install 'kafkatunnel[verify]')"
    java = shutil.which("java")
    if java is None:
        return f"Spark needs Java {MIN_JAVA} or newer and there is no `java` on PATH: {JAVA_FIX}"
    try:
        out = subprocess.run([java, "-version"], capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.TimeoutExpired) as error:
        return f"`java -version` failed: {error}: {JAVA_FIX}"
    text = out.stderr + out.stdout
    digits = text.split('"')[1] if '"' in text else ""
    major = digits.split(".")[0]
    if major == "1":  # 1.8.0_...
        major = digits.split(".")[1]
    if major.isdigit() and int(major) < MIN_JAVA:
        return f"Spark needs Java {MIN_JAVA} or newer; `java` is {digits}: {JAVA_FIX}"
    return None


def spark_session(
    master: str = "local[*]", log: Path | None = None, settings: Mapping[str, str] | None = None
) -> SparkSession:
    """A Spark session for verify. On a cluster, this kafkatunnel is shipped to the workers
    (pure Python); its dependencies (kio has a native part) must be installed there, e.g.
    `pip install kafkatunnel` in the workers' Python (PYSPARK_PYTHON). `settings`: more
    Spark settings (object_storage_settings' for s3a:// recordings).

    With `log`, the JVM's own output (its launcher's notes, Spark's start-up lines, the
    Python workers it starts) goes to that file instead of this process's terminal, so a
    report is only the report."""
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    os.environ.setdefault("PYSPARK_DRIVER_PYTHON", sys.executable)
    logging_config = Path(__file__).with_name("log4j2.properties").as_uri()
    os.environ.setdefault(
        "PYSPARK_SUBMIT_ARGS",
        f'--driver-java-options "-Dlog4j2.configurationFile={logging_config}" pyspark-shell',
    )
    if master.startswith(("local", "spark://127.", "spark://localhost")):
        os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")  # stay on loopback
    from pyspark.sql import SparkSession

    builder = (
        SparkSession.builder.master(master)
        .appName("kafkatunnel verify")
        .config("spark.ui.enabled", "false")
        .config("spark.ui.showConsoleProgress", "false")
        .config("spark.driver.host", "127.0.0.1")
        .config("spark.driver.bindAddress", "127.0.0.1")
    )
    for key, value in (settings or {}).items():
        builder = builder.config(key, value)
    with _output_to(log):
        spark = builder.getOrCreate()
    spark.sparkContext.setLogLevel("ERROR")
    if not master.startswith("local"):
        spark.sparkContext.addPyFile(str(package_archive()))
    return spark


@contextlib.contextmanager
def _output_to(log: Path | None) -> Iterator[None]:
    """Standard output and error of the processes started meanwhile (the JVM inherits
    them when pyspark launches it) go to `log`."""
    if log is None:
        yield
        return
    sys.stdout.flush()
    sys.stderr.flush()
    saved = [os.dup(1), os.dup(2)]
    target = os.open(log, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    try:
        os.dup2(target, 1)
        os.dup2(target, 2)
        yield
    finally:
        os.dup2(saved[0], 1)
        os.dup2(saved[1], 2)
        for fd in (*saved, target):
            os.close(fd)


def package_archive() -> Path:
    """A zip of this kafkatunnel package, for the workers."""
    import tempfile

    import kafkatunnel

    root = Path(kafkatunnel.__file__ or "").parent
    where = Path(tempfile.mkdtemp(prefix="kafkatunnel-pyfiles-"))
    return Path(shutil.make_archive(str(where / root.name), "zip", root.parent, root.name))
