"""Every command, given what a user gets wrong: a non-zero exit, one message naming the
cause, and never a Python traceback."""

from __future__ import annotations

import logging
import os
import shutil
import socket
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from kafkatunnel.cli import main as cli_main
from kafkatunnel.cli import tunnel as cli_tunnel
from kafkatunnel.cli.main import main
from kafkatunnel.demo import free_port

EXEC = "socat STDIO TCP:{host}:{port}"

# (command line, what the message must name). {free}: a free port, {taken}: a port in use,
# {tmp}: a fresh directory, {garbage}: a directory of files that are not captures.
# fmt: off
CASES: list[tuple[str, list[str], str]] = [
    ("coordinator refused", ["coordinator", "g", "--bootstrap", "127.0.0.1:{free}"],
     "Connection refused"),
    ("coordinator no port", ["coordinator", "g", "--bootstrap", "nohost"], "expected HOST:PORT"),
    ("coordinator unknown host",
     ["coordinator", "g", "--bootstrap", "nosuchhost.invalid:9092"], "nosuchhost.invalid"),
    ("coordinator empty group", ["coordinator", ""], "empty group id"),
    ("coordinator no partitions", ["coordinator", "g", "--partitions", "0"], "--partitions"),
    ("up bootstrap port not a number", ["up", "--bootstrap", "nohost:abc"], "'nohost:abc'"),
    ("up refused bootstrap",
     ["up", "--via", "direct", "--bootstrap", "127.0.0.1:{free}", "--listen", "127.0.0.1:{free2}",
      "--start-timeout", "2"], "Connection refused"),
    ("up exec command fails",
     ["up", "--exec", "sh -c 'echo no route to {host}:{port} >&2; exit 3'",
      "--bootstrap", "k-0.k:9092", "--listen", "127.0.0.1:{free}", "--start-timeout", "2"],
     "exited with 3: no route to k-0.k:9092"),
    ("up exec program missing",
     ["up", "--exec", "no-such-program {host} {port}", "--bootstrap", "k-0.k:9092",
      "--listen", "127.0.0.1:{free}", "--start-timeout", "2"], "cannot run `no-such-program`"),
    ("up exec without port", ["up", "--exec", "nc {host}", "--bootstrap", "k-0.k:9092"],
     "has no {port}"),
    ("up via unknown", ["up", "--via", "ssh", "--bootstrap", "k-0.k:9092"], "'ssh' is not one of"),
    ("up exec missing", ["up", "--via", "exec", "--bootstrap", "k-0.k:9092"],
     "needs a command template"),
    ("up map malformed", ["up", "--via", "direct", "--map", "a=b", "--bootstrap", "k-0.k:9092"],
     "--map 'a=b': 'b' is not HOST:PORT"),
    ("up port in use",
     ["up", "--exec", EXEC, "--bootstrap", "k-0.k:9092", "--listen", "127.0.0.1:{taken}"],
     "already in use"),
    ("up address not here",
     ["up", "--exec", EXEC, "--bootstrap", "k-0.k:9092", "--listen", "192.0.2.1:{free}"],
     "Cannot assign requested address"),
    ("up listen malformed", ["up", "--exec", EXEC, "--bootstrap", "k-0.k:9092", "--listen", "x"],
     "expected HOST:PORT"),
    ("up mode unknown", ["up", "--exec", EXEC, "--bootstrap", "k-0.k:9092", "--mode", "tls"],
     "'tls' is not one of"),
    ("up transparent without dns",
     ["up", "--exec", EXEC, "--bootstrap", "k-0.k:9092", "--mode", "transparent"],
     "needs the DNS shim"),
    ("up loop unknown", ["up", "--exec", EXEC, "--bootstrap", "k-0.k:9092", "--loop", "trio"],
     "'trio' is not one of"),
    ("up broker port malformed",
     ["up", "--exec", EXEC, "--bootstrap", "k-0.k:9092", "--broker-port", "one"],
     "expected NODE_ID=PORT"),
    ("up record rotate malformed",
     ["up", "--exec", EXEC, "--bootstrap", "k-0.k:9092", "--record-rotate", "big"],
     "expected a size"),
    ("up record unwritable",
     ["up", "--exec", EXEC, "--bootstrap", "k-0.k:9092", "--record", "/proc/kafkatunnel"],
     "cannot write recordings to /proc/kafkatunnel"),
    ("up record payloads alone",
     ["up", "--exec", EXEC, "--bootstrap", "k-0.k:9092", "--record-payloads"],
     "goes with --record DIR"),
    ("up negative start timeout",
     ["up", "--exec", EXEC, "--bootstrap", "k-0.k:9092", "--start-timeout", "-1"],
     "--start-timeout"),
    ("up timeout not a number",
     ["up", "--exec", EXEC, "--bootstrap", "k-0.k:9092", "--connect-timeout", "soon"],
     "'--connect-timeout' (env var: 'KAFKATUNNEL_CONNECT_TIMEOUT'): Input should be a valid"),
    ("up unknown flag", ["up", "--bootstrapp", "k-0.k:9092"], "No such option: --bootstrapp"),
    ("up kubectl with exec", ["up", "--via", "kubectl", "--exec", EXEC], "do not go with"),
    ("status without tunnel", ["status"], "no running tunnel"),
    ("status port not a number", ["status", "--port", "x"],
     "'--port': Input should be a valid integer"),
    ("down without tunnel", ["down"], "no running tunnel"),
    ("dns setup without tunnel", ["dns", "setup"], "need exactly one running tunnel"),
    ("doctor bootstrap refused", ["doctor", "--bootstrap", "127.0.0.1:{free}"],
     "Connection refused"),
    ("up tls ca missing",
     ["up", "--exec", EXEC, "--bootstrap", "k-0.k:9092", "--tls", "--tls-ca", "{tmp}/none.pem"],
     "none.pem: no such file"),
    ("up tls ca not pem",
     ["up", "--exec", EXEC, "--bootstrap", "k-0.k:9092", "--tls", "--tls-ca", "/proc/version"],
     "no PEM certificate could be read"),
    ("up tls key without cert",
     ["up", "--exec", EXEC, "--bootstrap", "k-0.k:9092", "--tls", "--tls-key", "/proc/version"],
     "--tls-key needs --tls-cert"),
    ("up tls option without tls",
     ["up", "--exec", EXEC, "--bootstrap", "k-0.k:9092", "--tls-ca", "/proc/version"],
     "--tls-ca goes with --tls"),
    ("up tls pkcs12 missing",
     ["up", "--exec", EXEC, "--bootstrap", "k-0.k:9092", "--tls", "--tls-pkcs12", "{tmp}/me.p12"],
     "me.p12: No such file"),
    ("up tls pkcs12 not pkcs12",
     ["up", "--exec", EXEC, "--bootstrap", "k-0.k:9092", "--tls", "--tls-pkcs12", "/proc/version"],
     "cannot be opened (no password was given, or it is not PKCS#12)"),
    ("demo unknown cluster", ["demo", "--cluster", "strimzi"],
     "Invalid value for --cluster: 'strimzi' is not embedded or apache"),
    ("up namespace not a name",
     ["up", "--exec", EXEC, "--bootstrap", "k-0.k:9092", "--namespace", "Shop!"],
     "Invalid value for --namespace: 'Shop!' is not a Kubernetes namespace name"),
    ("up kafka user without kubectl",
     ["up", "--exec", EXEC, "--bootstrap", "k-0.k:9092", "--kafka-user", "alice"],
     "reads the user's secret with kubectl: add --via kubectl"),
    ("up kubernetes name in a public suffix",
     ["up", "--exec", EXEC, "--bootstrap", "kafka.shop.svc.com:9092"],
     "its cluster domain 'com' is a public suffix"),
    ("up advertise not a name",
     ["up", "--exec", EXEC, "--bootstrap", "k-0.k:9092", "--advertise", "a b"],
     "Invalid value for --advertise: 'a b' is not a host name"),
    ("up container network alone",
     ["up", "--exec", EXEC, "--bootstrap", "k-0.k:9092", "--container-network", "shop"],
     "--container-network"),
    ("up for containers without the network",
     ["up", "--exec", EXEC, "--bootstrap", "k-0.k:9092", "--for-containers",
      "--container-network", "kt-no-such-bridge"],
     "kt-no-such-bridge"),
    ("up service without kubectl",
     ["up", "--exec", EXEC, "--bootstrap", "k-0.k:9092", "--service", "schema-registry"],
     "Invalid value for --service: forwards Kubernetes services: add --via kubectl"),
    ("up companions without kubectl",
     ["up", "--exec", EXEC, "--bootstrap", "k-0.k:9092", "--companions"],
     "Invalid value for --companions: forwards Kubernetes services: add --via kubectl"),
    ("up service not a name",
     ["up", "--via", "kubectl", "--bootstrap", "k-0.k:9092", "--service", "my_registry"],
     "'my_registry' is not a Kubernetes service name"),
    ("up tls in transparent mode",
     ["up", "--exec", EXEC, "--bootstrap", "k-0.k:9092", "--tls", "--mode", "transparent",
      "--dns", "--dns-listen", "127.0.0.1:{free}", "--dns-setup", "none"],
     "--tls and --client-tls are for rewrite mode"),
    ("doctor resolver malformed",
     ["doctor", "--bootstrap", "127.0.0.1:{free}", "--resolver", "nohost"],
     "expected the DNS server's HOST:PORT"),
    ("verify nothing named", ["verify"], "name at least one recording"),
    ("verify missing file", ["verify", "--in-process", "{tmp}/missing.pcapng"], "no recording at"),
    ("verify no captures", ["verify", "--in-process", "{garbage}"],
     "not a pcap or pcapng file"),
    ("verify report unwritable",
     ["verify", "--in-process", "{garbage}", "--json", "/proc/kafkatunnel.json"],
     "cannot write /proc/kafkatunnel.json"),
    ("verify broker malformed", ["verify", "--in-process", "{garbage}", "--broker", "127.0.0.3=2"],
     "expected ADDRESS=NODE"),
    ("config show unknown command", ["config", "show", "--command", "verify"],
     "'verify' is not one of"),
    ("profile missing", ["--profile", "nosuch", "status"], "profile 'nosuch'"),
    ("config file missing", ["--config", "{tmp}/none.toml", "status"], "no configuration file"),
    ("unknown command", ["tunnel"], "No such command 'tunnel'"),
]
# fmt: on


@pytest.fixture
def taken_port() -> Iterator[int]:
    with socket.socket() as holder:
        holder.bind(("127.0.0.1", 0))
        holder.listen()
        yield holder.getsockname()[1]


def _run(argv: list[str], tmp_path: Path, prefix: list[str] | None = None) -> tuple[int, str]:
    env = {**os.environ, "KAFKATUNNEL_STATE_DIR": str(tmp_path / "state")}
    for name in [k for k in env if k.startswith("KAFKATUNNEL_") and k != "KAFKATUNNEL_STATE_DIR"]:
        del env[name]
    env.pop("COLUMNS", None)
    result = subprocess.run(
        [*(prefix or []), sys.executable, "-m", "kafkatunnel", *argv],
        capture_output=True, text=True, timeout=60, cwd=tmp_path, env=env,
    )  # fmt: skip
    return result.returncode, result.stdout + result.stderr


def _fill(arg: str, values: dict[str, object]) -> str:
    """Placeholders of this table only: {host} and {port} stay for --exec templates."""
    for name, value in values.items():
        arg = arg.replace("{" + name + "}", str(value))
    return arg


@pytest.mark.parametrize(("argv", "cause"), [c[1:] for c in CASES], ids=[c[0] for c in CASES])
def test_a_bad_input_gets_one_clear_message(
    argv: list[str], cause: str, tmp_path: Path, taken_port: int
) -> None:
    garbage = tmp_path / "garbage"
    garbage.mkdir()
    (garbage / "notes.pcapng").write_text("not a capture\n")
    (garbage / "readme.txt").write_text("hello\n")
    fill = {"free": free_port(), "free2": free_port(), "taken": taken_port, "tmp": tmp_path,
            "garbage": garbage}  # fmt: skip
    code, output = _run([_fill(arg, fill) for arg in argv], tmp_path)
    assert code != 0, output
    assert cause in " ".join(output.split()), output
    assert "Traceback" not in output, output


@pytest.mark.skipif(not shutil.which("setpriv"), reason="setpriv (util-linux) drops privileges")
def test_a_port_without_permission_gets_one_clear_message(tmp_path: Path) -> None:
    """Ports below 1024 need CAP_NET_BIND_SERVICE: root here, so drop that capability."""
    prefix = []
    if os.geteuid() == 0:
        prefix = ["setpriv", "--bounding-set=-net_bind_service", "--inh-caps=-net_bind_service"]
    code, output = _run(
        ["up", "--exec", EXEC, "--bootstrap", "k-0.k:9092", "--listen", "127.0.0.1:81"],
        tmp_path, prefix,
    )  # fmt: skip
    assert code != 0, output
    assert "cannot listen on 127.0.0.1:81: Permission denied" in output, output
    assert "Traceback" not in output, output


@pytest.mark.parametrize("verbose", [False, True])
def test_an_unexpected_failure_is_one_message_and_a_bug_report_hint(
    verbose: bool, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """What escapes every command's own handling: one message and exit 70; the traceback
    only with -vv, for the bug report."""

    def broken(*args: object) -> None:
        raise RuntimeError("a surprise")

    def levels_only(verbose: int, quiet: bool) -> None:  # pytest keeps its log handlers
        logging.getLogger().setLevel(logging.DEBUG if verbose >= 2 else logging.WARNING)

    monkeypatch.setattr(cli_main, "configure_logging", levels_only)
    monkeypatch.setattr(cli_tunnel, "run_status", broken)
    monkeypatch.setattr(sys, "argv", ["kafkatunnel", *(["-vv"] if verbose else []), "status"])
    level = logging.getLogger().level
    try:
        with pytest.raises(SystemExit) as exit_:
            main()
    finally:
        logging.getLogger().setLevel(level)
    assert exit_.value.code == 70
    err = capsys.readouterr().err
    assert "RuntimeError: a surprise" in err and "-vv" in err
    assert ("Traceback" in err) == verbose


def test_a_listeners_mechanism_names_reach_the_user_only_as_sasl_names() -> None:
    """The mechanisms a SASL listener names are shown in the log and suggested as a client
    setting: a name with a newline, an escape or a shell's `;`, or a flood of names, is
    not passed on; well-formed names are, in the broker's order."""
    import io
    import struct

    from kio.schema.errors import ErrorCode
    from kio.schema.sasl_handshake.v1.response import SaslHandshakeResponse
    from kio.serial import entity_writer

    from kafkatunnel.probe import decode_answer, mechanisms_wanted

    hostile = ("SCRAM-SHA-512\nWARNING forged", "\x1b[2Jscreen", "PLAIN; rm -rf ~", "x" * 21)
    named = (*hostile, "SCRAM-SHA-512", "OAUTHBEARER", *(f"M{i}" for i in range(20)))
    body = io.BytesIO()
    entity_writer(SaslHandshakeResponse)(
        body, SaslHandshakeResponse(error_code=ErrorCode.unsupported_sasl_mechanism,
                                    mechanisms=named))  # fmt: skip
    payload = struct.pack(">i", 7) + body.getvalue()
    answer = decode_answer(struct.pack(">i", len(payload)) + payload, 17, 1)
    wanted = mechanisms_wanted(answer)
    assert wanted == ("SCRAM-SHA-512", "OAUTHBEARER", *(f"M{i}" for i in range(6)))
