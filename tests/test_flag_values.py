"""Every flag's bad value, through the command line as a user types it: a usage error
(exit status 2, one line that names the flag) before anything starts, never a traceback.
The values are the ones that slip past a quick check: digits str.isdigit() takes and int()
refuses ('²') or reads (Arabic-Indic, fullwidth), a negative, zero, 65536, a value given
twice, an empty one; and for every flag that takes an address or a URL, brackets that do not
pair and an IPv6 host outside them (`::1:9092`: ::1 port 9092, or the address ::1:9092?)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from kafkatunnel.demo import free_port

EXEC = ["--exec", "socat STDIO TCP:{host}:{port}", "--bootstrap", "kafka-0.kafka:9092"]
UP = ["up", *EXEC, "--listen", "127.0.0.1:{free}", "--start-timeout", "2", "--no-table"]
DIRECT = ["up", "--via", "direct", "--bootstrap", "kafka-0.kafka:9092", "--start-timeout", "2",
          "--listen", "127.0.0.1:{free}", "--no-table"]  # fmt: skip
KUBECTL = ["up", "--via", "kubectl", "--bootstrap", "kafka-0.kafka:9092", "--listen",
           "127.0.0.1:{free}", "--no-table"]  # fmt: skip

SASL = ["--sasl-mechanism", "scram-sha-512", "--sasl-username", "alice",
        "--sasl-password-file", "/etc/hostname"]  # fmt: skip

OAUTH = ["--sasl-mechanism", "OAUTHBEARER", "--sasl-client-id", "c",
         "--sasl-client-secret-env", "HOME"]  # fmt: skip

FULLWIDTH_9092 = "\uff19\uff10\uff19\uff12"  # int() reads it as 9092

# (case, command line, the flag the error line names, what else it says).
# {free}: the tunnel's --listen port, free in this run; {tmp}: a fresh directory.
# fmt: off
CASES: list[tuple[str, list[str], str, str]] = [
    ("broker-port negative node", [*UP, "--broker-port", "--1=19093"], "--broker-port",
     "expected NODE_ID=PORT"),
    ("broker-port superscript node", [*UP, "--broker-port", "²=19093"], "--broker-port",
     "expected NODE_ID=PORT"),
    ("broker-port node past int32", [*UP, "--broker-port", "2147483648=19093"], "--broker-port",
     "expected NODE_ID=PORT"),
    ("broker-port superscript port", [*UP, "--broker-port", "1=²"], "--broker-port",
     "port '²' is not a number between 1 and 65535"),
    ("broker-port arabic-indic port", [*UP, "--broker-port", "1=١٩٠٩٣"], "--broker-port",
     "is not a number between 1 and 65535"),
    ("broker-port zero", [*UP, "--broker-port", "1=0"], "--broker-port",
     "port 0 is not between 1 and 65535"),
    ("broker-port 65536", [*UP, "--broker-port", "1=65536"], "--broker-port",
     "port 65536 is not between 1 and 65535"),
    ("broker-port node twice", [*UP, "--broker-port", "1=19093", "--broker-port", "1=19094"],
     "--broker-port", "node 1 is given twice"),
    ("broker-port port twice", [*UP, "--broker-port", "1=19093", "--broker-port", "2=19093"],
     "--broker-port 2=19093", "port 19093 is --broker-port 1=19093's already"),
    ("broker-port the listen port", [*UP, "--broker-port", "1={free}"], "--broker-port 1=",
     "is --listen's already"),
    ("metrics-listen the listen port", [*UP, "--metrics-listen", "127.0.0.1:{free}"],
     "--metrics-listen", "is --listen's already"),
    ("dns-listen the listen port",
     [*UP, "--dns", "--dns-setup", "none", "--dns-listen", "127.0.0.1:{free}"], "--dns-listen",
     "is --listen's already"),
    ("service local port the listen port", [*KUBECTL, "--service", "registry={free}"],
     "--service registry=", "is --listen's already"),
    ("listen superscript", [*UP, "--listen", "127.0.0.1:²"], "--listen",
     "port '²' is not a number between 1 and 65535"),
    ("listen arabic-indic", [*UP, "--listen", "127.0.0.1:٣"], "--listen",
     "is not a number between 1 and 65535"),
    ("listen no host", [*UP, "--listen", ":9092"], "--listen", "is not HOST:PORT"),
    ("metrics-listen fullwidth", [*UP, "--metrics-listen", f"127.0.0.1:{FULLWIDTH_9092}"],
     "--metrics-listen", "is not a number between 1 and 65535"),
    ("dns-listen superscript", [*UP, "--dns", "--dns-setup", "none", "--dns-listen",
                                "127.0.0.1:²"], "--dns-listen", "is not a number"),
    ("bootstrap superscript", ["up", "--exec", "nc {host} {port}", "--bootstrap", "kafka-0:²"],
     "--bootstrap", "port '²' is not a number between 1 and 65535"),
    ("bootstrap arabic-indic", ["up", "--exec", "nc {host} {port}", "--bootstrap", "kafka-0:٣"],
     "--bootstrap", "is not a number between 1 and 65535"),
    ("broker superscript", [*UP, "--broker", "kafka-1.kafka:²"], "--broker",
     "port '²' is not a number"),
    ("map superscript", [*DIRECT, "--map", "kafka-0.kafka:9092=127.0.0.1:²"], "--map",
     "port '²' is not a number"),
    ("map reachable port zero", [*DIRECT, "--map", "kafka-0.kafka:9092=127.0.0.1:0"], "--map",
     "port 0 is not between 1 and 65535"),
    ("map advertised port 65536", [*DIRECT, "--map", "kafka-0.kafka:65536=127.0.0.1:1"], "--map",
     "port 65536 is not between 1 and 65535"),
    ("service superscript port", [*KUBECTL, "--service", "registry:²"], "--service",
     "PORT '²' is not a port"),
    ("service arabic-indic local port", [*KUBECTL, "--service", "registry=٣"], "--service",
     "LOCALPORT '٣' is not a port"),
    ("kafka-port zero", [*KUBECTL, "--kafka-port", "0"], "--kafka-port",
     "greater than or equal to 1"),
    ("kafka-port 65536", [*KUBECTL, "--kafka-port", "65536"], "--kafka-port",
     "less than or equal to 65535"),
    ("record-rotate superscript", [*UP, "--record-rotate", "²MiB"], "--record-rotate",
     "expected a size"),
    ("record-rotate arabic-indic", [*UP, "--record-rotate", "٣MiB"], "--record-rotate",
     "expected a size"),
    ("connect-timeout infinite", [*UP, "--connect-timeout", "inf"], "--connect-timeout",
     "must be a number of seconds"),
    ("start-timeout infinite", [*UP, "--start-timeout", "1e400"], "--start-timeout",
     "must be a number of seconds"),
    ("max-brokers past the ports", [*UP, "--max-brokers", "65536"], "--max-brokers",
     "must be from 1 to 65535"),
    ("dns-first-address IPv6", [*UP, "--dns-first-address", "::1"], "--dns-first-address",
     "is not an IPv4 address"),
    ("dns-first-address off loopback", [*UP, "--dns-first-address", "10.0.0.2"],
     "--dns-first-address", "is not on loopback"),
    ("dns-first-address without room", [*UP, "--dns-first-address", "127.255.255.250"],
     "--dns-first-address", "addresses for 5 brokers, not the 256 of --max-brokers"),
    ("exec empty", ["up", "--exec", "", "--bootstrap", "kafka-0.kafka:9092"], "--exec",
     "empty: give COMMAND"),
    ("record empty", [*UP, "--record", ""], "--record", "empty: give DIR"),
    ("advertise empty", [*UP, "--advertise", ""], "--advertise", "empty: give HOST"),
    ("kafka-user empty", [*KUBECTL, "--kafka-user", ""], "--kafka-user", "empty: give NAME"),
    ("via empty", [*UP, "--via", ""], "--via", "empty"),
    ("sasl-mechanism unknown", [*UP, *SASL, "--sasl-mechanism", "SCRAM-SHA-1"],
     "--sasl-mechanism", "'SCRAM-SHA-1' is not one of SCRAM-SHA-256, SCRAM-SHA-512, PLAIN"),
    ("sasl-username without a mechanism", [*UP, "--sasl-username", "alice"],
     "--sasl-username", "goes with --sasl-mechanism"),
    ("sasl-mechanism without a user", [*UP, "--sasl-mechanism", "PLAIN",
                                       "--sasl-password-env", "HOME"],
     "--sasl-mechanism", "needs --sasl-username NAME"),
    ("sasl-mechanism without a password", [*UP, "--sasl-mechanism", "PLAIN",
                                           "--sasl-username", "alice"],
     "--sasl-mechanism", "--sasl-password-file FILE or --sasl-password-env VARIABLE"),
    ("sasl password from two places", [*UP, *SASL, "--sasl-password-env", "HOME"],
     "--sasl-mechanism", "needs the password from one place"),
    ("sasl-password-file missing", [*UP, "--sasl-mechanism", "PLAIN", "--sasl-username", "a",
                                    "--sasl-password-file", "{tmp}/none"],
     "--sasl-password-file", "/none: No such file or directory"),
    ("sasl-password-file empty", [*UP, "--sasl-mechanism", "PLAIN", "--sasl-username", "a",
                                  "--sasl-password-file", "/dev/null"],
     "--sasl-password-file", "the password is empty"),
    ("sasl-password-env unset", [*UP, "--sasl-mechanism", "PLAIN", "--sasl-username", "a",
                                 "--sasl-password-env", "KT_NO_SUCH_VARIABLE"],
     "--sasl-password-env", "the environment variable KT_NO_SUCH_VARIABLE is not set"),
    ("sasl-token-endpoint http elsewhere", [*UP, "--sasl-mechanism", "OAUTHBEARER",
                                            "--sasl-token-endpoint", "http://idp.example/t",
                                            "--sasl-client-id", "c",
                                            "--sasl-client-secret-env", "HOME"],
     "--sasl-token-endpoint", "would send the client secret unencrypted to idp.example: give "
     "the endpoint's https:// URL, or --sasl-token-endpoint-insecure"),
    ("sasl with kafka-user", [*KUBECTL, *SASL, "--kafka-user", "alice"], "--sasl-mechanism",
     "--kafka-user and --sasl-mechanism both say who logs in: give one"),
    ("sasl in transparent mode", [*UP, "--mode", "transparent", "--dns", *SASL],
     "--sasl-mechanism", "in transparent mode clients log in themselves"),
    ("sasl-username empty", [*UP, "--sasl-mechanism", "PLAIN", "--sasl-username", ""],
     "--sasl-username", "empty: give NAME"),
    ("tls-ca empty", [*UP, "--tls", "--tls-ca", ""], "--tls-ca", "empty: give FILE"),
    ("doctor bootstrap superscript", ["doctor", "--bootstrap", "127.0.0.1:²"], "--bootstrap",
     "port '²' is not a number"),
    ("doctor resolver port zero", ["doctor", "--bootstrap", "127.0.0.1:9092", "--resolver",
                                   "127.0.0.1:0"], "--resolver", "port 0 is not between"),
    ("doctor port zero", ["doctor", "--port", "0"], "--port", "greater than or equal to 1"),
    ("coordinator bootstrap arabic-indic", ["coordinator", "g", "--bootstrap", "127.0.0.1:٣"],
     "--bootstrap", "is not a number between 1 and 65535"),
    ("status port 65536", ["status", "--port", "65536"], "--port", "less than or equal to 65535"),
    ("down port negative", ["down", "--port", "-1"], "--port", "greater than or equal to 1"),
    ("verify broker superscript node", ["verify", "--in-process", "{tmp}", "--broker",
                                        "127.0.0.3:9092=²"], "--broker", "expected ADDRESS=NODE"),
    ("verify broker twice", ["verify", "--in-process", "{tmp}", "--broker", "127.0.0.3:9092=1",
                             "--broker", "127.0.0.3:9092=2"], "--broker", "is given twice"),
    # every flag that takes an address or a URL: brackets pair, an IPv6 host is in them
    ("listen bracket left open", [*UP, "--listen", "[::1"], "--listen",
     "'[::1' opens a bracket it does not close"),
    ("listen bracket left open before the port", [*UP, "--listen", "[::1:9092"], "--listen",
     "opens a bracket it does not close"),
    ("listen bracket never opened", [*UP, "--listen", "::1]:9092"], "--listen",
     "has brackets that do not pair"),
    ("listen ipv6 without a port", [*UP, "--listen", "::1"], "--listen",
     "'::1' has no port: write an IPv6 host with its port as [::1]:PORT"),
    ("listen ipv6 bare", [*UP, "--listen", "::1:9092"], "--listen",
     "an IPv6 host goes in brackets: write [::1]:9092"),
    ("listen brackets round a name", [*UP, "--listen", "[localhost]:9092"], "--listen",
     "brackets hold an IPv6 address"),
    ("metrics-listen ipv6 bare", [*UP, "--metrics-listen", "::1:9100"], "--metrics-listen",
     "write [::1]:9100"),
    ("metrics-listen bracket left open", [*UP, "--metrics-listen", "[::1:9100"],
     "--metrics-listen", "opens a bracket it does not close"),
    ("dns-listen bracket left open", [*UP, "--dns", "--dns-setup", "none", "--dns-listen",
                                      "[::1:53"], "--dns-listen", "opens a bracket"),
    ("dns-listen ipv6 bare", [*UP, "--dns", "--dns-setup", "none", "--dns-listen", "::1:53"],
     "--dns-listen", "write [::1]:53"),
    ("bootstrap bracket left open", ["up", "--exec", "nc {host} {port}", "--bootstrap",
                                     "[::1:9092"], "--bootstrap", "opens a bracket"),
    ("bootstrap ipv6 bare", ["up", "--exec", "nc {host} {port}", "--bootstrap", "::1:9092"],
     "--bootstrap", "write [::1]:9092"),
    ("broker bracket never opened", [*UP, "--broker", "::1]:9092"], "--broker",
     "brackets that do not pair"),
    ("map advertised bracket left open", [*DIRECT, "--map", "[::1=127.0.0.1:1"], "--map",
     "'[::1' opens a bracket"),
    ("map reachable ipv6 bare", [*DIRECT, "--map", "kafka-0.kafka:9092=::1:31092"], "--map",
     "write [::1]:31092"),
    ("advertise in brackets", [*UP, "--advertise", "[::1]"], "--advertise",
     "is not a host name"),
    ("dns-first-address bracket left open", [*UP, "--dns-first-address", "[::1"],
     "--dns-first-address", "is not an IPv4 address"),
    ("sasl-token-endpoint bracket left open", [*UP, *OAUTH, "--sasl-token-endpoint",
                                               "http://[::1"], "--sasl-token-endpoint",
     "'http://[::1' is not an http(s) URL: '[::1' opens a bracket it does not close"),
    ("sasl-token-endpoint text after the bracket", [*UP, *OAUTH, "--sasl-token-endpoint",
                                                    "https://[::1]x/token"],
     "--sasl-token-endpoint", "a port goes after the ']'"),
    ("sasl-token-endpoint ipv6 bare", [*UP, *OAUTH, "--sasl-token-endpoint",
                                       "https://::1/token"], "--sasl-token-endpoint",
     "write an IPv6 host with its port as [::1]:PORT"),
    ("sasl-token-endpoint port past 65535", [*UP, *OAUTH, "--sasl-token-endpoint",
                                             "https://[::1]:65536/token"],
     "--sasl-token-endpoint", "port 65536 is not between 1 and 65535"),
    ("sasl-token-endpoint port no number", [*UP, *OAUTH, "--sasl-token-endpoint",
                                            "https://idp.example:https/token"],
     "--sasl-token-endpoint", "port 'https' is not a number"),
    ("sasl-token-endpoint no http", [*UP, *OAUTH, "--sasl-token-endpoint", "idp.example/t"],
     "--sasl-token-endpoint", "is not an http(s) URL"),
    ("doctor bootstrap ipv6 bare", ["doctor", "--bootstrap", "::1:9092"], "--bootstrap",
     "write [::1]:9092"),
    ("doctor bootstrap bracket left open", ["doctor", "--bootstrap", "[::1"], "--bootstrap",
     "opens a bracket"),
    ("doctor resolver bracket left open", ["doctor", "--bootstrap", "127.0.0.1:9092",
                                           "--resolver", "[::1:53"], "--resolver",
     "opens a bracket"),
    ("doctor resolver ipv6 bare", ["doctor", "--bootstrap", "127.0.0.1:9092", "--resolver",
                                   "::1:53"], "--resolver", "write [::1]:53"),
    ("coordinator bootstrap bracket left open", ["coordinator", "g", "--bootstrap",
                                                 "127.0.0.1:9092,[::1"], "--bootstrap",
     "opens a bracket"),
    ("coordinator bootstrap ipv6 bare", ["coordinator", "g", "--bootstrap", "::1:9092"],
     "--bootstrap", "write [::1]:9092"),
    ("verify replay-against bracket left open", ["verify", "--in-process", "{tmp}",
                                                 "--replay-against", "[::1:9092"],
     "--replay-against", "opens a bracket"),
    ("verify replay-against ipv6 bare", ["verify", "--in-process", "{tmp}",
                                         "--replay-against", "::1:9092"],
     "--replay-against", "write [::1]:9092"),
    ("verify broker bracket left open", ["verify", "--in-process", "{tmp}", "--broker",
                                         "[::1:9092=1"], "--broker", "opens a bracket"),
    ("verify broker ipv6 bare", ["verify", "--in-process", "{tmp}", "--broker", "::1:9092=1"],
     "--broker", "write [::1]:9092"),
    ("verify master bracket left open", ["verify", "{tmp}", "--master", "spark://[::1"],
     "--master", "opens a bracket"),
    ("verify master ipv6 bare", ["verify", "{tmp}", "--master", "spark://::1:7077"],
     "--master", "write [::1]:7077"),
    ("verify master port no number", ["verify", "{tmp}", "--master", "spark://m:x"],
     "--master", "port 'x' is not a number"),
    ("dns setup port 65536", ["dns", "setup", "--port", "65536"], "--port",
     "less than or equal to 65535"),
]
# fmt: on


@pytest.mark.parametrize(
    ("argv", "flag", "said"), [c[1:] for c in CASES], ids=[c[0] for c in CASES]
)
def test_a_bad_value_is_one_line_naming_its_flag(
    argv: list[str], flag: str, said: str, tmp_path: Path
) -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith("KAFKATUNNEL_")}
    env.pop("COLUMNS", None)
    env["KAFKATUNNEL_STATE_DIR"] = str(tmp_path / "state")
    port = str(free_port())
    filled = [a.replace("{free}", port).replace("{tmp}", str(tmp_path)) for a in argv]
    result = subprocess.run([sys.executable, "-m", "kafkatunnel", *filled], capture_output=True,
                            text=True, timeout=60, cwd=tmp_path, env=env)  # fmt: skip
    output = result.stdout + result.stderr
    assert result.returncode == 2, output
    assert "Traceback" not in output and "bootstrap.servers=" not in output, output
    errors = [line for line in result.stderr.splitlines() if line.startswith(("Error:", "error:"))]
    assert len(errors) == 1 and errors[0].startswith("Error: Invalid value for "), output
    assert flag.replace("{free}", port) in errors[0] and said in errors[0], output
