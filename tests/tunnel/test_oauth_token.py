"""The OAUTHBEARER token's request and the reading of the token endpoint's answer (pure
functions, fed answers as identity providers write them), the token source's sharing and
refresh (its HTTP request replaced by a function that counts), and `up`'s OAUTHBEARER
flags and profile keys. That a real endpoint and a real broker agree is shown with
Keycloak and Apache Kafka (tests/apache/test_login_oauth.py)."""

from __future__ import annotations

import asyncio
import base64
import json
import logging
import os
import re
import socket
import subprocess
import sys
import threading
import time
import urllib.parse
from pathlib import Path

import pytest
import typer

from kafkatunnel.cli.up_options import Reach, SaslFlags, UpOptions, check
from kafkatunnel.localcluster import free_port_run
from kafkatunnel.tunnel import oauth_token
from kafkatunnel.tunnel.oauth_token import (
    MAX_ANSWER,
    Fetch,
    TokenEndpoint,
    TokenError,
    TokenSource,
    read_token_answer,
    token_request,
)

pytestmark = pytest.mark.quick

SECRET = b"s3cret+/ &x"
ENDPOINT = TokenEndpoint("https://idp.example/realms/kafka/protocol/openid-connect/token",
                         "kafkatunnel", SECRET, "kafka", None,
                         "--sasl-client-secret-file secret")  # fmt: skip
NOW = 1_800_000_000.0


def jwt(claims: dict[str, object]) -> str:
    def part(value: dict[str, object]) -> str:
        return base64.urlsafe_b64encode(json.dumps(value).encode()).decode().rstrip("=")

    return f"{part({'alg': 'RS256', 'typ': 'JWT'})}.{part(claims)}.c2lnbmF0dXJl"


def answer(**fields: object) -> bytes:
    return json.dumps(fields).encode()


def test_the_grant_is_the_client_credentials_with_basic_authentication() -> None:
    body, headers = token_request(ENDPOINT)
    assert urllib.parse.parse_qs(body.decode()) == {"grant_type": ["client_credentials"],
                                                     "scope": ["kafka"]}  # fmt: skip
    scheme, _, basic = headers["Authorization"].partition(" ")
    user, _, secret = base64.b64decode(basic).decode().partition(":")
    assert scheme == "Basic"
    # RFC 6749 2.3.1: each part form-encoded before Basic joins them
    assert (urllib.parse.unquote_plus(user), urllib.parse.unquote_plus(secret)) == (
        "kafkatunnel", SECRET.decode())  # fmt: skip
    assert headers["Content-Type"] == "application/x-www-form-urlencoded"


def test_a_jwt_says_its_expiry_and_subject_and_expires_in_its_lifetime() -> None:
    token = jwt({"exp": NOW + 290, "iat": NOW - 10, "sub": "service-account"})
    read = read_token_answer(ENDPOINT, 200, answer(access_token=token, token_type="Bearer",
                                                   expires_in=300), NOW)  # fmt: skip
    assert (read.value, read.lifetime, read.expires_at, read.subject) == (
        token, 300.0, NOW + 290, "service-account")  # fmt: skip
    assert token not in repr(read)
    # not sent in its last second: exp is whole seconds from when it was issued
    assert not read.ended(NOW + 298.9) and read.ended(NOW + 299)


def test_without_expires_in_the_lifetime_is_the_jwts_and_an_opaque_token_needs_one() -> None:
    token = jwt({"exp": NOW + 50, "iat": NOW - 10})
    read = read_token_answer(ENDPOINT, 200, answer(access_token=token, token_type="bearer"), NOW)
    assert (read.lifetime, read.expires_at, read.subject) == (60.0, NOW + 50, None)
    opaque = read_token_answer(ENDPOINT, 200, answer(access_token="opaque-token",
                               token_type="Bearer", expires_in=30), NOW)  # fmt: skip
    assert (opaque.lifetime, opaque.expires_at) == (30.0, NOW + 30)


def test_the_endpoints_refusal_is_shown_naming_the_client_and_the_endpoint() -> None:
    said = answer(error="invalid_client", error_description="Invalid client credentials")
    with pytest.raises(TokenError) as refused:
        read_token_answer(ENDPOINT, 401, said, NOW)
    assert str(refused.value) == (
        f"the token endpoint refused client kafkatunnel at {ENDPOINT.url} (HTTP 401): "
        "invalid_client: Invalid client credentials; check the client id and the secret "
        "(--sasl-client-secret-file secret), and that the client may use the client "
        "credentials grant")  # fmt: skip
    assert refused.value.permanent


def test_an_endpoint_that_echoes_the_secret_does_not_make_the_tunnel_show_it() -> None:
    said = answer(error="invalid_client", error_description=f"bad secret {SECRET.decode()}\n"
                  + "x" * 1000)  # fmt: skip
    with pytest.raises(TokenError) as refused:
        read_token_answer(ENDPOINT, 400, said, NOW)
    shown = str(refused.value)
    assert SECRET.decode() not in shown and "bad secret ***" in shown
    assert "\n" not in shown and len(shown) < 700  # one line, cut short


@pytest.mark.parametrize("at", range(270, 300))
@pytest.mark.parametrize("form", ["as is", "form-encoded"])
def test_an_echoed_secret_where_the_text_is_cut_shows_no_part_of_it(at: int, form: str) -> None:
    """The secret is blanked before the text is cut short, not after: a secret that
    straddles the cut would otherwise show its first characters."""
    secret = SECRET.decode() if form == "as is" else urllib.parse.quote_plus(SECRET.decode())
    said = answer(error="invalid_client", error_description="x" * at + secret + "y" * 50)
    with pytest.raises(TokenError) as refused:
        read_token_answer(ENDPOINT, 400, said, NOW)
    shown = str(refused.value).split("invalid_client: ", 1)[1]
    assert not any(secret[:n] in shown.replace("x", "") for n in range(3, len(secret) + 1)), shown


def test_a_jwt_exp_no_clock_can_show_is_not_shown_as_its_end() -> None:
    """`exp` is the endpoint's word for status only; one past any calendar (or negative)
    gives the end its lifetime says, which the status table can show."""
    for exp in (10**17, -(10**17)):
        token = jwt({"exp": exp})
        read = read_token_answer(ENDPOINT, 200, answer(access_token=token, token_type="Bearer",
                                                       expires_in=300), NOW)  # fmt: skip
        assert read.expires_at == NOW + 300
        time.localtime(read.expires_at)  # what the status table does with it


@pytest.mark.parametrize(
    ("status", "body", "said"),
    [
        (200, b"x" * (MAX_ANSWER + 1), "over 256 KiB"),
        (404, b"<html>Not Found</html>", "HTTP 404 and no OAuth JSON object"),
        (200, b"[1, 2]", "no OAuth JSON object"),
        (200, b"\xff\xfe", "no OAuth JSON object"),
        (200, b"[" * 100_000, "no OAuth JSON object"),
        (200, answer(token_type="Bearer", expires_in=60), "holds no bearer token"),
        (
            200,
            answer(access_token="two words", token_type="Bearer", expires_in=60),
            "holds no bearer token",
        ),
        (200, answer(access_token=7, token_type="Bearer", expires_in=60), "holds no bearer"),
        (200, answer(access_token="t", token_type="mac", expires_in=60), "of type mac, not"),
        (200, answer(access_token="t", expires_in=60), "of type none, not Bearer"),
        (200, answer(access_token="t", token_type="Bearer"), "says no lifetime"),
        (200, answer(access_token="t", token_type="Bearer", expires_in="60"), "no lifetime"),
        (200, answer(access_token="t", token_type="Bearer", expires_in=True), "no lifetime"),
        (200, answer(access_token="t", token_type="Bearer", expires_in=0), "lifetime is 0 s"),
        (200, answer(access_token="t", token_type="Bearer", expires_in=-5), "is -5 s"),
        (200, answer(access_token="t", token_type="Bearer", expires_in=10**12), "not believed"),
        (200, answer(access_token="t", token_type="Bearer", expires_in=0.001), "not believed"),
        (200, answer(error="server_error"), "refused client kafkatunnel at https://idp"),
        (503, answer(), "(HTTP 503): no error code"),
    ],
)
def test_an_answer_that_is_no_token_is_refused_saying_why(
    status: int, body: bytes, said: str
) -> None:
    with pytest.raises(TokenError) as refused:
        read_token_answer(ENDPOINT, status, body, NOW)
    assert said in str(refused.value)
    assert "client kafkatunnel at https://idp.example" in str(refused.value)


def test_one_token_is_fetched_for_all_and_again_at_80_percent_of_its_lifetime() -> None:
    """Logins that ask at once share one fetch; a second token comes at 80% of the first
    one's lifetime, before it ends, and is the one logins get after."""
    fetched: list[float] = []

    def fetch(endpoint: TokenEndpoint) -> tuple[int, bytes]:
        fetched.append(time.monotonic())
        time.sleep(0.05)  # the logins below all wait on this one
        token = f"token-{len(fetched)}"
        return 200, answer(access_token=token, token_type="Bearer", expires_in=1.0)

    async def run() -> list[str]:
        source = TokenSource(ENDPOINT, fetch)
        try:
            first = await asyncio.gather(*(source.current() for _ in range(5)))
            assert len(fetched) == 1
            deadline = time.monotonic() + 5
            while source.fetches < 2 and time.monotonic() < deadline:
                await asyncio.sleep(0.02)
            later = await source.current()
            return [*(t.value for t in first), later.value]
        finally:
            source.close()

    values = asyncio.run(run())
    assert values == ["token-1"] * 5 + ["token-2"]
    assert 0.75 < fetched[1] - fetched[0] < 0.95  # 80% of 1 s (and the first fetch's 50 ms)


REFUSAL = answer(error="invalid_client", error_description="Invalid client credentials")


def token_then_refusals(lifetime: float, fetched: list[float]) -> Fetch:
    """An endpoint that gives one token, then refuses the client (its secret changed)."""

    def fetch(endpoint: TokenEndpoint) -> tuple[int, bytes]:
        fetched.append(time.monotonic())
        if len(fetched) == 1:
            return 200, answer(access_token="token-1", token_type="Bearer", expires_in=lifetime)
        return 401, REFUSAL

    return fetch


def test_a_stop_while_a_refresh_hangs_on_the_endpoint_is_not_held_up_by_it() -> None:
    """An endpoint that stops answering mid-run: the refresh waits on it (up to the
    request's own bound), and the tunnel stopping meanwhile ends at once, not when the
    request gives up (`down` waits only so long for a tunnel to end)."""
    hang = threading.Event()
    fetched: list[float] = []

    def fetch(endpoint: TokenEndpoint) -> tuple[int, bytes]:
        fetched.append(time.monotonic())
        if len(fetched) == 1:
            return 200, answer(access_token="token-1", token_type="Bearer", expires_in=1.0)
        hang.wait(60)  # no answer
        return 401, REFUSAL

    async def run() -> None:
        source = TokenSource(ENDPOINT, fetch)
        await source.current()
        deadline = time.monotonic() + 5
        while len(fetched) < 2 and time.monotonic() < deadline:
            await asyncio.sleep(0.02)
        assert len(fetched) == 2, "the refresh did not start"
        source.close()

    started = time.monotonic()
    try:
        asyncio.run(run())
        stopped_after = time.monotonic() - started
    finally:
        hang.set()
    assert stopped_after < 10, f"the stop waited {stopped_after:.1f}s for the endpoint"


def test_a_failed_refresh_keeps_the_valid_token_then_logins_fail_with_the_endpoints_words() -> None:
    """The refresh refused: the token held is used until it ends (the refusal kept for
    status); then a login fails with the endpoint's refusal, saying the token ended, and
    the logins that follow within RETRY_PAUSE do not ask the endpoint again."""
    fetched: list[float] = []
    fetch = token_then_refusals(2.0, fetched)

    async def run() -> tuple[str, str | None, list[str]]:
        source = TokenSource(ENDPOINT, fetch)
        try:
            token = await source.current()
            deadline = time.monotonic() + 5
            while source.last_error is None and time.monotonic() < deadline:
                await asyncio.sleep(0.02)
            # refused at 1.6 s; the token is sent until 1.8 s (its last tenth is not)
            assert (await source.current()).value == token.value
            while not token.ended(time.time()) and time.monotonic() < deadline:
                await asyncio.sleep(0.02)
            asked = len(fetched)
            said = []
            for _ in range(3):
                with pytest.raises(TokenError) as refused:
                    await source.current()  # ended: no token to log in with
                said.append(str(refused.value))
            assert len(fetched) == asked  # the refresh's refusal, under RETRY_PAUSE old
            return token.value, source.last_error, said
        finally:
            source.close()

    value, error, said = asyncio.run(run())
    refusal = ("the token endpoint refused client kafkatunnel at https://idp.example/realms/"
               "kafka/protocol/openid-connect/token (HTTP 401): invalid_client: Invalid client "
               "credentials; check the client id and the secret")  # fmt: skip
    assert value == "token-1" and error is not None and error.startswith(refusal), error
    assert all(re.fullmatch(rf"the token ended at \d\d:\d\d:\d\d and no new one came: "
                            rf"{re.escape(refusal)}.*", text) for text in said), said  # fmt: skip


def test_a_refresh_refused_again_and_again_is_logged_once(
    caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The log says the refusal when it comes, not again at each attempt (every
    RETRY_PAUSE seconds, here shortened)."""
    monkeypatch.setattr(oauth_token, "RETRY_PAUSE", 0.05)
    fetched: list[float] = []

    async def run() -> None:
        source = TokenSource(ENDPOINT, token_then_refusals(1.0, fetched))
        try:
            await source.current()
            deadline = time.monotonic() + 5
            while len(fetched) < 6 and time.monotonic() < deadline:
                await asyncio.sleep(0.02)
        finally:
            source.close()

    with caplog.at_level(logging.DEBUG, logger=oauth_token.__name__):
        asyncio.run(run())
    refused = [r for r in caplog.records if "not refreshed" in r.getMessage()]
    assert len(fetched) >= 6 and len(refused) >= 5, (fetched, refused)
    warned = [r.getMessage() for r in refused if r.levelno == logging.WARNING]
    assert len(warned) == 1 and "invalid_client" in warned[0], warned


def test_the_first_token_is_fetched_before_the_tunnel_runs() -> None:
    """`up` asks for it before the event loop runs; the first login uses it."""
    fetched: list[str] = []

    def fetch(endpoint: TokenEndpoint) -> tuple[int, bytes]:
        fetched.append(endpoint.url)
        return 200, answer(access_token=f"token-{len(fetched)}", token_type="Bearer",
                           expires_in=60)  # fmt: skip

    source = TokenSource(ENDPOINT, fetch)
    assert source.fetch_first().value == "token-1"

    async def first_login() -> str:
        try:
            return (await source.current()).value
        finally:
            source.close()

    assert asyncio.run(first_login()) == "token-1" and len(fetched) == 1


def closed_port() -> tuple[socket.socket, int]:
    """A port on 127.0.0.1 that refuses connections while the socket is held (bound, not
    listening)."""
    holder = socket.socket()
    holder.bind(("127.0.0.1", 0))
    return holder, holder.getsockname()[1]


@pytest.mark.parametrize("where", ["closed-port", "unresolved-name"])
def test_an_unreachable_token_endpoint_stops_up_at_once_saying_why(
    tmp_path: Path, where: str
) -> None:
    """At start, a token endpoint that cannot be reached stops `up` at once (not after
    --start-timeout) with one line naming it, the cause and the flag to check: not a
    broker that did not answer, nor the forwarder's hint."""
    holder, port = closed_port()
    url, cause = {
        "closed-port": (f"http://127.0.0.1:{port}/token", "connection refused (nothing listens "
                        "there); check --sasl-token-endpoint and that the identity provider "
                        "runs"),
        "unresolved-name": ("http://idp.invalid/token", "the name idp.invalid is not resolved "
                            "("),
    }[where]  # fmt: skip
    secret = tmp_path / "secret"
    secret.write_text("s3cret-of-the-client\n")
    secret.chmod(0o600)
    listen = f"127.0.0.1:{free_port_run(1)}"
    argv = [sys.executable, "-m", "kafkatunnel", "up", "--no-table", "--bootstrap",
            "kafka-0.kafka:9092", "--exec", "nc {host} {port}", "--listen", listen,
            "--start-timeout", "60", "--sasl-mechanism", "OAUTHBEARER",
            "--sasl-token-endpoint", url, "--sasl-client-id", "kafkatunnel",
            "--sasl-client-secret-file", str(secret)]  # fmt: skip
    clean = {k: v for k, v in os.environ.items() if not k.startswith("KAFKATUNNEL_")}
    started = time.monotonic()
    try:
        out = subprocess.run(argv, cwd=tmp_path, env={**clean, "COLUMNS": "1000"},
                             capture_output=True, text=True, timeout=60)  # fmt: skip
    finally:
        holder.close()
    took = time.monotonic() - started
    lines = out.stderr.splitlines()
    assert out.returncode == 2 and len(lines) == 1, out.stderr
    told = f"error: the tunnel cannot log in: cannot reach the token endpoint {url} for client"
    assert lines[0].startswith(f"{told} kafkatunnel: {cause}"), lines
    assert took < 30, took  # at once, not after --start-timeout 60
    assert "s3cret-of-the-client" not in out.stdout + out.stderr


OAUTH = {"mechanism": "OAUTHBEARER", "token_endpoint": "https://idp.example/token",
         "client_id": "kafkatunnel", "client_secret_env": "SECRET"}  # fmt: skip


@pytest.mark.parametrize(
    ("flags", "flag"),
    [
        ({**OAUTH, "token_endpoint": None}, "--sasl-mechanism"),
        ({**OAUTH, "token_endpoint": "ftp://idp/token"}, "--sasl-token-endpoint"),
        ({**OAUTH, "token_endpoint": "https://u:p@idp/token"}, "--sasl-token-endpoint"),
        ({**OAUTH, "client_id": None}, "--sasl-mechanism"),
        ({**OAUTH, "client_secret_env": None}, "--sasl-mechanism"),
        ({**OAUTH, "client_secret_file": Path("s")}, "--sasl-mechanism"),
        ({**OAUTH, "username": "alice"}, "--sasl-username"),
        ({**OAUTH, "password_env": "P"}, "--sasl-password-env"),
        (
            {**OAUTH, "token_endpoint": "http://idp/t", "token_endpoint_ca": Path("ca")},
            "--sasl-token-endpoint-ca",
        ),
        (
            {"mechanism": "PLAIN", "username": "a", "password_env": "P", "scope": "kafka"},
            "--sasl-scope",
        ),
        ({"client_id": "kafkatunnel"}, "--sasl-client-id"),
    ],
)
def test_a_wrong_oauthbearer_flag_is_named(flags: dict[str, object], flag: str) -> None:
    options = UpOptions(Reach(bootstrap="kafka-0.kafka:9092", exec_template="nc {host} {port}"),
                        sasl=SaslFlags(**flags))  # type: ignore[arg-type]  # fmt: skip
    with pytest.raises(typer.BadParameter) as refused:
        check(options)
    assert refused.value.param_hint == flag


def test_the_oauthbearer_settings_come_from_a_profile(tmp_path: Path) -> None:
    """The OAUTHBEARER flags as profile keys: up reads them (its error names the secret's
    file from the profile)."""
    (tmp_path / "kafkatunnel.toml").write_text(
        '[profiles.p]\nbootstrap = "kafka-0.kafka:9092"\nexec = "nc {host} {port}"\n'
        'sasl-mechanism = "OAUTHBEARER"\nsasl-token-endpoint = "https://idp.example/token"\n'
        'sasl-client-id = "kafkatunnel"\nsasl-client-secret-file = "no-such-file"\n'
        'sasl-scope = "kafka"\n'
    )
    clean = {k: v for k, v in os.environ.items() if not k.startswith("KAFKATUNNEL_")}
    out = subprocess.run([sys.executable, "-m", "kafkatunnel", "--profile", "p", "up",
                          "--no-table"], cwd=tmp_path, env=clean, capture_output=True,
                         text=True, timeout=60)  # fmt: skip
    assert out.returncode == 2 and "Traceback" not in out.stderr, out.stderr
    said = " ".join(out.stderr.split())
    assert "--sasl-client-secret-file: cannot read no-such-file" in said, said
