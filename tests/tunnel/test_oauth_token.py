"""The OAUTHBEARER token's request and the reading of the token endpoint's answer (pure
functions, fed answers as identity providers write them), the token source's sharing and
refresh (its HTTP request replaced by a function that counts), and `up`'s OAUTHBEARER
flags and profile keys. That a real endpoint and a real broker agree is shown with
Keycloak and Apache Kafka (tests/apache/test_login_oauth.py)."""

from __future__ import annotations

import asyncio
import base64
import json
import os
import subprocess
import sys
import time
import urllib.parse
from pathlib import Path

import pytest
import typer

from kafkatunnel.cli.up_options import Reach, SaslFlags, UpOptions, check
from kafkatunnel.tunnel.oauth_token import (
    MAX_ANSWER,
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
    assert not read.ended(NOW + 299) and read.ended(NOW + 300)


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


def test_a_failed_refresh_keeps_the_valid_token_and_says_why() -> None:
    answers = [(200, answer(access_token="token-1", token_type="Bearer", expires_in=0.5)),
               (401, answer(error="invalid_client"))]  # fmt: skip

    def fetch(endpoint: TokenEndpoint) -> tuple[int, bytes]:
        return answers.pop(0) if len(answers) > 1 else answers[0]

    async def run() -> tuple[str, str | None]:
        source = TokenSource(ENDPOINT, fetch)
        try:
            token = await source.current()
            deadline = time.monotonic() + 5
            while source.last_error is None and time.monotonic() < deadline:
                await asyncio.sleep(0.02)
            assert (await source.current()).value == token.value  # still valid: 0.4 s < 0.5 s
            await asyncio.sleep(0.2)
            with pytest.raises(TokenError, match="refused client kafkatunnel"):
                await source.current()  # ended: no token to log in with
            return token.value, source.last_error
        finally:
            source.close()

    value, error = asyncio.run(run())
    assert value == "token-1" and error is not None and "invalid_client" in error


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
