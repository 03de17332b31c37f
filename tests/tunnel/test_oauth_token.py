"""The OAUTHBEARER token's request and the reading of the token endpoint's answer (pure
functions, fed answers as identity providers write them, and fuzzed with any answer one
can give), the token source's sharing and refresh (its HTTP request replaced by a function
that counts), and `up`'s OAUTHBEARER flags and profile keys (an http:// endpoint elsewhere
needs consent; the environment's proxy is never used); `up` against real endpoints that
cannot give a token (nothing listens, a name not resolved, a socket that never answers, an
https endpoint whose certificate is not trusted or is for another name). That a real
endpoint and a real broker agree is shown with Keycloak and Apache Kafka
(tests/apache/test_login_oauth.py)."""

from __future__ import annotations

import asyncio
import base64
import contextlib
import http.server
import json
import logging
import math
import os
import re
import socket
import ssl
import subprocess
import sys
import threading
import time
import urllib.parse
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
import typer
from hypothesis import given, settings
from hypothesis import strategies as st

from kafkatunnel.cli.up_options import Reach, SaslFlags, UpOptions, check
from kafkatunnel.demo import free_port_run
from kafkatunnel.tunnel import oauth_token
from kafkatunnel.tunnel.oauth_token import (
    BEARER_TOKEN,
    MAX_ANSWER,
    MAX_LIFETIME,
    MAX_TOKEN,
    MIN_LIFETIME,
    Fetch,
    NoAnswer,
    TokenEndpoint,
    TokenError,
    TokenSource,
    read_token_answer,
    token_request,
)
from tests.worlds.authority import Authority

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


PAST_A_FLOAT = 10**400  # a JSON number Python reads as an int no float holds


@pytest.mark.parametrize(
    ("where", "fields"),
    [
        ("expires_in", {"expires_in": PAST_A_FLOAT}),
        ("expires_in below", {"expires_in": -PAST_A_FLOAT}),
        ("exp", {"claims": {"exp": PAST_A_FLOAT}}),
        ("exp with iat", {"claims": {"exp": PAST_A_FLOAT, "iat": NOW}}),
        ("iat", {"claims": {"exp": NOW + 60, "iat": PAST_A_FLOAT}}),
        ("iat below", {"claims": {"exp": NOW + 60, "iat": -PAST_A_FLOAT}}),
        ("both", {"claims": {"exp": PAST_A_FLOAT, "iat": PAST_A_FLOAT}}),
    ],
)
def test_a_lifetime_past_what_a_float_holds_is_not_believed(
    where: str, fields: dict[str, object]
) -> None:
    """`expires_in`, `exp` or `iat` of 10**400 (valid JSON): a lifetime not believed,
    said as such, not an OverflowError out of the reader."""
    claims = fields.get("claims")
    token = "opaque-token" if claims is None else jwt(claims)  # type: ignore[arg-type]
    rest = {k: v for k, v in fields.items() if k != "claims"}  # the parameter stays as given
    body = answer(access_token=token, token_type="Bearer", **rest)
    with pytest.raises(TokenError) as refused:
        read_token_answer(ENDPOINT, 200, body, NOW)
    said = str(refused.value)
    assert said == (f"the token endpoint gave client kafkatunnel at {ENDPOINT.url} a token "
                    "whose lifetime is past any clock: not believed (from 1 s to a year "
                    "is)"), said  # fmt: skip


def test_an_exp_past_what_a_float_holds_beside_expires_in_is_not_shown_as_the_end() -> None:
    token = jwt({"exp": PAST_A_FLOAT, "iat": -PAST_A_FLOAT, "sub": "service-account"})
    read = read_token_answer(ENDPOINT, 200, answer(access_token=token, token_type="Bearer",
                                                   expires_in=300), NOW)  # fmt: skip
    assert (read.lifetime, read.expires_at, read.subject) == (300.0, NOW + 300, "service-account")


# What an endpoint can answer, for the fuzz below: any JSON, numbers past a float (either
# way), NaN and the infinities, text of every size up to past the bounds, nesting.
NUMBERS = st.one_of(
    st.integers(),
    st.integers(-(10**1000), 10**1000),
    st.sampled_from([PAST_A_FLOAT, -PAST_A_FLOAT, 2**1024, 2**63, -(2**63), 0, -0.0]),
    st.floats(allow_nan=True, allow_infinity=True),
    st.floats(NOW - 2 * MAX_LIFETIME, NOW + 2 * MAX_LIFETIME),
    st.floats(-10.0, 2 * MAX_LIFETIME),
)
TEXT = st.one_of(
    st.text(max_size=40),
    st.builds(lambda piece, times: piece * times, st.text(min_size=1, max_size=3),
              st.sampled_from([300, MAX_TOKEN // 2, MAX_TOKEN + 1, MAX_ANSWER // 3])),
)  # fmt: skip
JSON = st.recursive(
    st.none() | st.booleans() | NUMBERS | TEXT,
    lambda inner: st.lists(inner, max_size=4)
    | st.dictionaries(st.text(max_size=8) | st.sampled_from(["exp", "iat", "sub", "error"]),
                      inner, max_size=4),
    max_leaves=12,
)  # fmt: skip
# bodies past the bounds: the JSON parser's recursion limit (RecursionError), Python's
# 4300 digits of an int (ValueError), MAX_ANSWER
HUGE = {
    "deep list": b"[" * 100_000,
    "deep object": b'{"a":' * 50_000,
    "deep exp": b'{"exp":' * 50_000,
    "over the bound": b"x" * (MAX_ANSWER + 1),
    "exp of 5000 digits": b'{"exp": 1' + b"0" * 5000 + b"}",
    "expires_in of 5000 digits": b'{"access_token": "t", "token_type": "Bearer", '
    b'"expires_in": 1' + b"0" * 5000 + b"}",
}


def huge(*names: str) -> st.SearchStrategy[bytes]:
    return st.sampled_from(names).map(HUGE.__getitem__)  # named: their repr is short


CLAIMS = st.fixed_dictionaries(
    {}, optional={"exp": NUMBERS | JSON, "iat": NUMBERS | JSON, "sub": TEXT | JSON}
)
PAYLOADS = st.one_of(
    CLAIMS.map(lambda claims: json.dumps(claims).encode()),
    JSON.map(lambda value: json.dumps(value).encode()),
    st.binary(max_size=64),
    huge("deep list", "deep exp", "exp of 5000 digits"),
)


def jwt_of(payload: bytes) -> str:
    return f"eyJhbGciOiJSUzI1NiJ9.{base64.urlsafe_b64encode(payload).decode().rstrip('=')}.c2ln"


TOKENS = st.one_of(
    JSON,
    st.from_regex(BEARER_TOKEN, fullmatch=True),
    PAYLOADS.map(jwt_of),
    st.sampled_from(["a.b.c", "..", "a.!!!.c"]),
)
ANSWERS = st.fixed_dictionaries(
    {},
    optional={
        "access_token": TOKENS,
        "token_type": st.sampled_from(["Bearer", "bearer", "mac"]) | JSON,
        "expires_in": NUMBERS | JSON,
        "error": st.sampled_from(["invalid_client", "invalid_scope"]) | JSON,
        "error_description": TEXT | JSON,
    },
)
# answers that would be a token but for their numbers: where the lifetime is read
NEARLY_TOKENS = st.fixed_dictionaries(
    {
        "access_token": st.from_regex(BEARER_TOKEN, fullmatch=True)
        | CLAIMS.map(lambda claims: jwt_of(json.dumps(claims).encode())),
        "token_type": st.just("Bearer"),
    },
    optional={"expires_in": NUMBERS},
)
BODIES = st.one_of(
    NEARLY_TOKENS.map(lambda fields: json.dumps(fields).encode()),
    ANSWERS.map(lambda fields: json.dumps(fields).encode()),
    ANSWERS.map(lambda fields: json.dumps(fields, ensure_ascii=False).encode("utf-8", "replace")),
    JSON.map(lambda value: json.dumps(value).encode()),
    st.binary(max_size=200),
    huge("deep list", "deep object", "over the bound", "expires_in of 5000 digits"),
)


@settings(max_examples=400, deadline=None)
@given(status=st.sampled_from([200, 200, 200, 400, 401, 500]) | st.integers(0, 999),
       body=BODIES)  # fmt: skip
def test_every_answer_an_endpoint_can_give_is_a_token_or_a_token_error(
    status: int, body: bytes
) -> None:
    """Whatever the endpoint says (any status; any JSON or none; numbers past a float,
    NaN, infinities; wrong types; text of any size; nesting past the recursion limit; JWTs
    whose claims are any of these, or no JSON): a Token the tunnel can use and show, or a
    TokenError that names the client and the endpoint in one line of printable text."""
    try:
        read = read_token_answer(ENDPOINT, status, body, NOW)
    except TokenError as refused:
        said = str(refused)
        assert said.startswith("the token endpoint") and ENDPOINT.describe() in said, said
        assert said.isprintable() and len(said) < 1000, said
        return
    assert BEARER_TOKEN.fullmatch(read.value) and len(read.value) <= MAX_TOKEN
    assert MIN_LIFETIME <= read.lifetime <= MAX_LIFETIME and read.asked_at == NOW
    assert math.isfinite(read.expires_at) and not read.ended(NOW)
    time.localtime(read.expires_at)  # what the status table does with it
    assert read.subject is None or (read.subject.isprintable() and len(read.subject) < 1000)


@pytest.mark.alone  # a bound on elapsed time
def test_one_token_is_fetched_for_all_and_again_at_80_percent_of_its_lifetime() -> None:
    """Logins that ask at once share one fetch; a second token comes at 80% of the first
    one's lifetime, before it ends, and is the one logins get after."""
    fetched: list[float] = []

    def fetch(endpoint: TokenEndpoint, within: float) -> tuple[int, bytes]:
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

    def fetch(endpoint: TokenEndpoint, within: float) -> tuple[int, bytes]:
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

    def fetch(endpoint: TokenEndpoint, within: float) -> tuple[int, bytes]:
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


@pytest.mark.alone  # a bound on elapsed time
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
            deadline = time.monotonic() + 5  # until the log has said 5 refusals (each is
            while len(said()) < 5 and time.monotonic() < deadline:  # logged after its fetch)
                await asyncio.sleep(0.02)
        finally:
            source.close()

    def said() -> list[logging.LogRecord]:
        return [r for r in caplog.records if "not refreshed" in r.getMessage()]

    with caplog.at_level(logging.DEBUG, logger=oauth_token.__name__):
        asyncio.run(run())
    refused = said()
    assert len(fetched) >= 6 and len(refused) >= 5, (fetched, refused)
    warned = [r.getMessage() for r in refused if r.levelno == logging.WARNING]
    assert len(warned) == 1 and "invalid_client" in warned[0], warned


def token_then(lifetime: float, then: Fetch, fetched: list[float]) -> Fetch:
    """An endpoint that gives one token, then answers as `then` does."""

    def fetch(endpoint: TokenEndpoint, within: float) -> tuple[int, bytes]:
        fetched.append(time.monotonic())
        if len(fetched) == 1:
            return 200, answer(access_token="token-1", token_type="Bearer", expires_in=lifetime)
        return then(endpoint, within)

    return fetch


def past_a_float(endpoint: TokenEndpoint, within: float) -> tuple[int, bytes]:
    return 200, answer(access_token="token-2", token_type="Bearer", expires_in=PAST_A_FLOAT)


def a_bug(endpoint: TokenEndpoint, within: float) -> tuple[int, bytes]:
    raise RuntimeError("a bug in the request")


@pytest.mark.parametrize(
    ("then", "said"),
    [
        (past_a_float, "a token whose lifetime is past any clock: not believed"),
        (a_bug, "internal error: RuntimeError: a bug in the request (a kafkatunnel bug"),
    ],
)
def test_a_refresh_that_fails_in_any_way_is_said_retried_and_paused_on(
    caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch, then: Fetch, said: str
) -> None:
    """However a refresh fails, even by a failure no answer should cause (`a_bug`: a
    request that raises what it never should, a fault no real endpoint produces on demand),
    the refresh goes on: the failure is logged once, in one line, kept for status; the
    endpoint is asked again every RETRY_PAUSE (here 0.1 s), and once the token held has
    ended, logins within RETRY_PAUSE fail with that cause without asking it again."""
    monkeypatch.setattr(oauth_token, "RETRY_PAUSE", 0.1)
    fetched: list[float] = []

    async def run() -> tuple[str | None, list[str], bool, int, int]:
        source = TokenSource(ENDPOINT, token_then(1.0, then, fetched))
        try:
            token = await source.current()
            deadline = time.monotonic() + 5  # refused at 0.8 s, then every 0.1 s
            while len(fetched) < 5 and time.monotonic() < deadline:
                await asyncio.sleep(0.02)
            alive = source._refresher is not None and not source._refresher.done()
            while not token.ended(time.time()) and time.monotonic() < deadline:
                await asyncio.sleep(0.02)
            monkeypatch.setattr(oauth_token, "RETRY_PAUSE", 60.0)  # no refresh from here on
            await asyncio.sleep(0.2)  # the one under way, if any, has failed
            asked = len(fetched)
            refusals = []
            for _ in range(3):
                with pytest.raises(TokenError) as refused:
                    await source.current()
                refusals.append(str(refused.value))
            return source.last_error, refusals, alive, asked, len(fetched)
        finally:
            source.close()

    with caplog.at_level(logging.DEBUG, logger=oauth_token.__name__):
        error, refusals, alive, asked, after = asyncio.run(run())
    assert alive and asked >= 5, (alive, fetched)  # the refresh went on after failing
    assert after == asked, fetched  # the logins did not ask again within RETRY_PAUSE
    assert error is not None and said in error, error
    assert all(said in refusal for refusal in refusals), refusals
    warned = [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING]
    assert len(warned) == 1 and said in warned[0] and "\n" not in warned[0], warned
    # a traceback only at DEBUG (-vv, for a bug report)
    assert [r for r in caplog.records if r.exc_info and r.levelno > logging.DEBUG] == []


def test_the_first_token_is_fetched_before_the_tunnel_runs() -> None:
    """`up` asks for it before the event loop runs; the first login uses it."""
    fetched: list[str] = []

    def fetch(endpoint: TokenEndpoint, within: float) -> tuple[int, bytes]:
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


CLIENT_SECRET = "s3cret-of-the-client"


def up_oauth(
    tmp_path: Path, url: str, *flags: str, env: dict[str, str] | None = None
) -> subprocess.CompletedProcess[str]:
    """`up` with OAUTHBEARER tokens from `url` (and `flags`, and `env` beside the
    environment), to a bootstrap broker that is not there: it ends on its own, at the token
    or at the broker."""
    secret = tmp_path / "secret"
    secret.write_text(f"{CLIENT_SECRET}\n")
    secret.chmod(0o600)
    listen = f"127.0.0.1:{free_port_run(1)}"
    argv = [sys.executable, "-m", "kafkatunnel", "up", "--no-table", "--bootstrap",
            "kafka-0.kafka:9092", "--exec", "nc {host} {port}", "--listen", listen,
            "--sasl-mechanism", "OAUTHBEARER", "--sasl-token-endpoint", url,
            "--sasl-client-id", "kafkatunnel", "--sasl-client-secret-file", str(secret),
            *flags]  # fmt: skip
    clean = {k: v for k, v in os.environ.items() if not k.startswith("KAFKATUNNEL_")}
    return subprocess.run(argv, cwd=tmp_path, env={**clean, "COLUMNS": "1000", **(env or {})},
                          capture_output=True, text=True, timeout=60)  # fmt: skip


def unreached_at_start(out: subprocess.CompletedProcess[str], url: str) -> str:
    """`up` stopped at start with one line: it cannot reach the token endpoint at `url`;
    the cause that line gives."""
    lines = out.stderr.splitlines()
    assert out.returncode == 2 and len(lines) == 1, out.stderr
    told = f"error: the tunnel cannot log in: cannot reach the token endpoint {url} for client "
    assert lines[0].startswith(f"{told}kafkatunnel: "), lines
    return lines[0].removeprefix(f"{told}kafkatunnel: ")


def closed_port() -> tuple[socket.socket, int]:
    """A port on 127.0.0.1 that refuses connections while the socket is held (bound, not
    listening)."""
    holder = socket.socket()
    holder.bind(("127.0.0.1", 0))
    return holder, holder.getsockname()[1]


@pytest.mark.parametrize("value", ["-1", "1e400"])
def test_a_bad_start_timeout_is_refused_before_the_token_endpoint_is_asked(
    tmp_path: Path, value: str
) -> None:
    """A setting the tunnel cannot run with stops `up` before the client secret is sent."""
    endpoint = socket.create_server(("127.0.0.1", 0))
    endpoint.setblocking(False)
    try:
        url = f"http://127.0.0.1:{endpoint.getsockname()[1]}/token"
        out = up_oauth(tmp_path, url, "--start-timeout", value)
        with pytest.raises(BlockingIOError):  # nobody connected
            endpoint.accept()[0].close()
    finally:
        endpoint.close()
    assert out.returncode == 2 and "--start-timeout" in out.stderr, out.stderr
    assert "must be a number of seconds, 0 or more" in out.stderr, out.stderr
    assert "Traceback" not in out.stderr and "SASL:" not in out.stdout, out.stdout


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
        "unresolved-name": ("https://idp.invalid/token", "the name idp.invalid is not resolved "
                            "("),
    }[where]  # fmt: skip
    started = time.monotonic()
    try:
        out = up_oauth(tmp_path, url, "--start-timeout", "60")
    finally:
        holder.close()
    took = time.monotonic() - started
    said = unreached_at_start(out, url)
    assert said.startswith(cause), said
    assert took < 30, took  # at once, not after --start-timeout 60
    assert CLIENT_SECRET not in out.stdout + out.stderr


def test_a_token_endpoint_url_where_something_else_listens_stops_up_saying_so(
    tmp_path: Path,
) -> None:
    """A URL with the wrong port, where another service answers first (an SSH server's
    greeting): not HTTP, which `up` says in one line, naming the flag, with no traceback.
    The greeting is Debian 12's openssh-server 9.2p1 identification line (RFC 4253 4.2),
    sent first and the client read until it leaves, as sshd does; only that line matters
    here, so no sshd runs."""
    with socket.create_server(("127.0.0.1", 0)) as listener:

        def greet() -> None:
            with contextlib.suppress(OSError):
                while True:
                    connection, _ = listener.accept()
                    with connection:  # the greeting, then read until the client leaves
                        connection.sendall(b"SSH-2.0-OpenSSH_9.2p1 Debian-2+deb12u3\r\n")
                        connection.settimeout(20)
                        while connection.recv(4096):
                            pass

        threading.Thread(target=greet, daemon=True).start()
        url = f"http://127.0.0.1:{listener.getsockname()[1]}/token"
        out = up_oauth(tmp_path, url, "--start-timeout", "20")
    assert unreached_at_start(out, url) == (
        "what answers there does not speak HTTP (SSH-2.0-OpenSSH_9.2p1 Debian-2+deb12u3); "
        "check --sasl-token-endpoint and its port")  # fmt: skip


class Silent:
    """A token endpoint that takes every connection and never says a byte (a provider that
    hangs, a proxy that holds the request): a fault no real identity provider produces on
    demand, so a real listening socket plays it. `accepted`: when each connection was
    taken (time.monotonic)."""

    def __init__(self) -> None:
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.port = self.listener.getsockname()[1]
        self.accepted: list[float] = []
        self.held: list[socket.socket] = []
        threading.Thread(target=self._take, daemon=True).start()

    def _take(self) -> None:
        with contextlib.suppress(OSError):  # closed
            while True:
                connection, _ = self.listener.accept()
                self.accepted.append(time.monotonic())
                self.held.append(connection)  # open and silent until the test ends

    def close(self) -> None:
        for held in [self.listener, *self.held]:
            held.close()


@pytest.fixture
def silent() -> Iterator[Silent]:
    endpoint = Silent()
    yield endpoint
    endpoint.close()


@pytest.mark.alone  # a bound on elapsed time
@pytest.mark.parametrize("scheme", ["http", "https"])
def test_a_token_endpoint_that_never_answers_stops_up_after_the_start_timeout(
    tmp_path: Path, silent: Silent, scheme: str
) -> None:
    """At start, an endpoint that takes the connection and says nothing (https: not even
    its half of the handshake) stops `up` once --start-timeout has passed (3 s here; not
    the per-request bound of a running tunnel, 15 s), with one line naming the endpoint,
    the wait and what to check or raise."""
    url = f"{scheme}://127.0.0.1:{silent.port}/token"
    started = time.monotonic()
    out = up_oauth(tmp_path, url, "--start-timeout", "3")
    ended = time.monotonic()
    assert len(silent.accepted) == 1, (silent.accepted, out.stderr)  # asked once
    waited = ended - silent.accepted[0]  # from the connection to the exit
    assert 2.9 <= waited < 6, (waited, out.stderr)  # the 3 s asked for, not 15 (nor less)
    assert ended - started < 12, ended - started
    lines = out.stderr.splitlines()
    assert out.returncode == 2 and len(lines) == 1, out.stderr
    assert lines[0] == (
        f"error: the tunnel cannot log in: the token endpoint {url} did not answer client "
        "kafkatunnel within 3 s; check --sasl-token-endpoint, that the identity provider "
        "runs and the network to it, or give it longer with --start-timeout")  # fmt: skip
    assert CLIENT_SECRET not in out.stdout + out.stderr


@pytest.mark.alone  # a bound on elapsed time
def test_the_first_token_is_waited_for_as_long_as_start_asks(
    silent: Silent, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The first fetch waits the time `up` gives it (its start timeout), however it
    compares with REQUEST_TIMEOUT (here 0.3 s, for a 1 s start), and no longer: for a
    socket that never answers, and for a request that never returns (a fetch that hangs
    where no socket timeout reaches: a name slow to resolve, a byte at a time)."""
    monkeypatch.setattr(oauth_token, "REQUEST_TIMEOUT", 0.3)
    release = threading.Event()

    def hangs(endpoint: TokenEndpoint, within: float) -> tuple[int, bytes]:
        release.wait(10)
        return 401, REFUSAL

    url = f"http://127.0.0.1:{silent.port}/token"
    sources = [TokenSource(TokenEndpoint(url, "kafkatunnel", SECRET, None, None, "")),
               TokenSource(ENDPOINT, hangs)]  # fmt: skip
    try:
        for source in sources:
            started = time.monotonic()
            with pytest.raises(NoAnswer) as unanswered:
                source.fetch_first(1.0)
            took = time.monotonic() - started
            assert 0.95 <= took < 3, (source, took)
            said = str(unanswered.value)
            assert f"{source.endpoint.url} did not answer client kafkatunnel within 1 s" in said
            assert said.endswith("or give it longer with --start-timeout"), said
    finally:
        release.set()
    assert len(silent.accepted) == 1


@pytest.mark.alone  # a bound on elapsed time
def test_a_refresh_the_endpoint_never_answers_is_given_up_after_the_request_timeout(
    silent: Silent, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Once the tunnel runs, a request to the token endpoint is waited for at most
    REQUEST_TIMEOUT (here 0.5 s): a login that needs a token fails then, saying so, rather
    than wait on an endpoint that never answers."""
    monkeypatch.setattr(oauth_token, "REQUEST_TIMEOUT", 0.5)
    url = f"http://127.0.0.1:{silent.port}/token"
    endpoint = TokenEndpoint(url, "kafkatunnel", SECRET, None, None, "")

    async def login() -> tuple[str, float]:
        source = TokenSource(endpoint)
        started = time.monotonic()
        try:
            with pytest.raises(NoAnswer) as unanswered:
                await source.current()
            return str(unanswered.value), time.monotonic() - started
        finally:
            source.close()

    said, took = asyncio.run(login())
    assert said == (
        f"the token endpoint {url} did not answer client kafkatunnel within 0.5 s; check "
        "--sasl-token-endpoint, that the identity provider runs and the network to it")  # fmt: skip
    assert 0.45 <= took < 3, took
    assert len(silent.accepted) == 1


def test_a_request_not_answered_in_time_is_waited_on_again_not_asked_anew(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """An endpoint that answers too slowly for REQUEST_TIMEOUT (a byte at a time, say)
    gets one request at a time: the next attempt waits on the one still running (and takes
    its token when it comes) instead of piling up threads and requests."""
    monkeypatch.setattr(oauth_token, "REQUEST_TIMEOUT", 0.2)
    monkeypatch.setattr(oauth_token, "RETRY_PAUSE", 0.0)
    release = threading.Event()
    fetched: list[float] = []

    def fetch(endpoint: TokenEndpoint, within: float) -> tuple[int, bytes]:
        fetched.append(within)
        release.wait(10)
        return 200, answer(access_token="token-1", token_type="Bearer", expires_in=60)

    async def logins() -> str:
        source = TokenSource(ENDPOINT, fetch)
        try:
            for _ in range(2):
                with pytest.raises(NoAnswer):
                    await source.current()
            release.set()
            return (await source.current()).value
        finally:
            source.close()

    assert asyncio.run(logins()) == "token-1"
    assert fetched == [0.2], fetched  # one request, its waits bounded as the source's


def test_a_request_kept_alive_past_its_bounds_is_given_up_for_a_new_one(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """urllib bounds each wait of a request, not the whole: an endpoint that keeps one
    alive a byte at a time is waited on again only for STUCK_AFTER of its bounds; then a
    new request goes, and once the endpoint is well the token comes."""
    monkeypatch.setattr(oauth_token, "REQUEST_TIMEOUT", 0.2)
    monkeypatch.setattr(oauth_token, "RETRY_PAUSE", 0.0)
    stuck = threading.Event()
    fetched: list[float] = []

    def fetch(endpoint: TokenEndpoint, within: float) -> tuple[int, bytes]:
        fetched.append(time.monotonic())
        if len(fetched) == 1:
            stuck.wait(30)  # the first request never ends (in the test's time)
        return 200, answer(access_token=f"token-{len(fetched)}", token_type="Bearer",
                           expires_in=60)  # fmt: skip

    async def logins() -> str:
        source = TokenSource(ENDPOINT, fetch)
        try:
            deadline = time.monotonic() + 10
            while time.monotonic() < deadline:
                try:
                    return (await source.current()).value
                except NoAnswer:
                    await asyncio.sleep(0.05)
            raise AssertionError("no token came")
        finally:
            source.close()

    try:
        token = asyncio.run(logins())
    finally:
        stuck.set()
    assert token == "token-2" and len(fetched) == 2, fetched
    assert fetched[1] - fetched[0] >= oauth_token.STUCK_AFTER * 0.2 - 0.05, fetched


def test_the_start_waits_as_long_as_asked_even_past_what_a_thread_can_wait() -> None:
    """--start-timeout takes any finite number; a wait past threading.TIMEOUT_MAX (some
    292 years) is cut to it, not an OverflowError."""

    def fetch(endpoint: TokenEndpoint, within: float) -> tuple[int, bytes]:
        time.sleep(0.2)  # answered while the start waits
        return 200, answer(access_token="token-1", token_type="Bearer", expires_in=60)

    assert TokenSource(ENDPOINT, fetch).fetch_first(1e300).value == "token-1"


def test_a_closed_source_starts_no_refresh() -> None:
    """A login still under way when the tunnel stops may get its token after the stop;
    it must not start the background refresh again."""

    def fetch(endpoint: TokenEndpoint, within: float) -> tuple[int, bytes]:
        return 200, answer(access_token="token-1", token_type="Bearer", expires_in=60)

    async def run() -> asyncio.Task[None] | None:
        source = TokenSource(ENDPOINT, fetch)
        source.close()
        await source.current()
        return source._refresher

    assert asyncio.run(run()) is None


@pytest.mark.parametrize("echoed", ["basic", "base64"])
def test_an_endpoint_that_echoes_the_authorization_header_does_not_show_the_secret(
    echoed: str,
) -> None:
    """The secret travels in the Basic credential; an endpoint that says the header back,
    or the secret in base64, shows none of it through the tunnel."""
    basic = token_request(ENDPOINT)[1]["Authorization"].removeprefix("Basic ")
    alone = base64.b64encode(SECRET).decode()
    said = {"basic": f"bad Authorization header: Basic {basic}", "base64": f"bad {alone}"}
    refusal = answer(error="invalid_client", error_description=said[echoed])
    with pytest.raises(TokenError) as refused:
        read_token_answer(ENDPOINT, 401, refusal, NOW)
    shown = str(refused.value)
    assert basic not in shown and alone.rstrip("=") not in shown and "***" in shown, shown


CUT_SHORT = (
    b"HTTP/1.1 401 Unauthorized\r\nTransfer-Encoding: chunked\r\n"
    b"Content-Type: application/json\r\n\r\nzz\r\n"
)  # a chunk size that is none


def test_an_error_answer_whose_body_is_cut_short_is_a_token_error() -> None:
    """A 401 whose chunked body breaks off (a proxy or endpoint that dies mid-answer):
    `up` says the endpoint could not be asked, not a traceback."""
    with socket.create_server(("127.0.0.1", 0)) as listener:

        def serve() -> None:
            with contextlib.suppress(OSError):
                connection, _ = listener.accept()
                with connection:
                    connection.settimeout(10)
                    connection.recv(65536)
                    connection.sendall(CUT_SHORT)

        threading.Thread(target=serve, daemon=True).start()
        port = listener.getsockname()[1]
        endpoint = TokenEndpoint(f"http://127.0.0.1:{port}/token", "kafkatunnel", SECRET)
        with pytest.raises(TokenError) as refused:
            oauth_token.http_fetch(endpoint, 5.0)
    assert f"cannot reach the token endpoint http://127.0.0.1:{port}/token" in str(refused.value)


@dataclass
class Https:
    """A real https token endpoint (http.server under the standard `ssl` module) with a
    certificate for `names` signed by a CA of the test's own (`ca`, PEM), which no system
    trusts; it answers every POST with a token and keeps what was asked (`asked`)."""

    url: str
    ca: Path
    asked: list[str]


@contextlib.contextmanager
def https_endpoint(
    directory: Path, names: list[str], host: str, tls: bool = True
) -> Iterator[Https]:
    """(With `tls` False, the same endpoint serving plain HTTP.)"""
    authority = Authority(directory, "identity provider CA")
    issued = authority.issue("identity-provider", names)
    asked: list[str] = []

    class Endpoint(http.server.BaseHTTPRequestHandler):
        def do_POST(self) -> None:
            length = int(self.headers.get("Content-Length") or 0)
            asked.append(self.rfile.read(length).decode())
            token = answer(access_token=jwt({"sub": "kafkatunnel", "exp": time.time() + 300}),
                           token_type="Bearer", expires_in=300)  # fmt: skip
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(token)))
            self.end_headers()
            self.wfile.write(token)

        def log_message(self, *args: object) -> None:
            pass

    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.load_cert_chain(issued.cert, issued.key)
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Endpoint)
    if tls:
        server.socket = context.wrap_socket(server.socket, server_side=True)
    serving = threading.Thread(target=server.serve_forever, daemon=True)
    serving.start()
    try:
        scheme = "https" if tls else "http"
        yield Https(f"{scheme}://{host}:{server.server_address[1]}/token", authority.pem, asked)
    finally:
        server.shutdown()
        server.server_close()


@pytest.mark.parametrize(
    ("case", "names", "host"),
    [
        ("not-trusted", ["127.0.0.1"], "127.0.0.1"),
        ("trusted-with-its-ca", ["127.0.0.1"], "127.0.0.1"),
        ("for-another-name", ["127.0.0.1"], "localhost"),
        ("for-another-address", ["idp.localhost"], "127.0.0.1"),
    ],
)
def test_an_https_token_endpoint_is_asked_only_when_its_certificate_is_trusted(
    tmp_path: Path, case: str, names: list[str], host: str
) -> None:
    """An https endpoint whose certificate's CA the tunnel does not know stops `up` at
    start, saying so and that --sasl-token-endpoint-ca gives it; with that flag, the same
    endpoint is asked for the token (and `up` goes on to the bootstrap broker, absent
    here). A certificate for another name stops `up` even with its CA, saying so."""
    with https_endpoint(tmp_path, names, host) as endpoint:
        ca = [] if case == "not-trusted" else ["--sasl-token-endpoint-ca", str(endpoint.ca)]
        out = up_oauth(tmp_path, endpoint.url, "--start-timeout", "1", *ca)
    lines = out.stderr.splitlines()
    assert CLIENT_SECRET not in out.stdout + out.stderr
    if case == "trusted-with-its-ca":  # the token came: up stops at the broker instead
        assert [urllib.parse.parse_qs(body) for body in endpoint.asked] == [
            {"grant_type": ["client_credentials"]}], endpoint.asked  # fmt: skip
        broker = "error: the bootstrap broker kafka-0.kafka:9092 did not answer within 1s"
        assert out.returncode == 2 and any(line.startswith(broker) for line in lines), lines
        assert "token" not in out.stderr, out.stderr
        return
    said = unreached_at_start(out, endpoint.url)
    if case == "not-trusted":
        assert endpoint.asked == []
        assert re.fullmatch(r"its certificate is not trusted \(unable to "
                            r"get local issuer certificate\); give its CA with "
                            r"--sasl-token-endpoint-ca", said), said  # fmt: skip
    else:
        assert endpoint.asked == []
        named = "IP address" if case == "for-another-address" else "Hostname"
        assert re.fullmatch(rf"its certificate is not for {host} "
                            rf"\({named} mismatch, certificate is not valid for '{host}'\.\); "
                            r"name the endpoint in --sasl-token-endpoint as its certificate "
                            r"does", said), said  # fmt: skip


def test_an_https_url_where_plain_http_answers_stops_up_saying_so(tmp_path: Path) -> None:
    """An https:// URL for an endpoint that serves plain HTTP: OpenSSL reads its answer to
    the hello as a wrong TLS version; `up` says what it means, and nothing was asked."""
    asked: list[str] = []

    class PlainEndpoint(http.server.BaseHTTPRequestHandler):
        def do_POST(self) -> None:
            asked.append(self.path)
            self.send_error(500)

        def log_message(self, *args: object) -> None:
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), PlainEndpoint)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        url = f"https://127.0.0.1:{server.server_address[1]}/token"
        out = up_oauth(tmp_path, url, "--start-timeout", "5")
    finally:
        server.shutdown()
        server.server_close()
    assert unreached_at_start(out, url) == (
        "what answers there does not speak TLS; an endpoint serving plain HTTP takes an "
        "http:// URL; check --sasl-token-endpoint and its port")  # fmt: skip
    assert asked == []


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
        ({**OAUTH, "token_endpoint": "http://idp.example/token"}, "--sasl-token-endpoint"),
        ({**OAUTH, "token_endpoint_insecure": True}, "--sasl-token-endpoint-insecure"),
        (
            {
                "mechanism": "PLAIN",
                "username": "a",
                "password_env": "P",
                "token_endpoint_insecure": True,
            },
            "--sasl-token-endpoint-insecure",
        ),
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


def oauth_options(url: str, insecure: bool = False) -> UpOptions:
    sasl = SaslFlags(**{**OAUTH, "token_endpoint": url, "token_endpoint_insecure": insecure})  # type: ignore[arg-type]
    return UpOptions(Reach(bootstrap="kafka-0.kafka:9092", exec_template="nc {host} {port}"),
                     sasl=sasl)  # fmt: skip


@pytest.mark.parametrize(
    "url",
    ["https://idp.example/token", "http://127.0.0.1:8080/token", "http://127.7.8.9/token",
     "http://[::1]:8080/token", "http://localhost:8080/token", "http://LocalHost/token",
     "http://[::ffff:127.0.0.1]/token"],
)  # fmt: skip
def test_a_token_endpoint_the_secret_reaches_encrypted_or_on_this_machine_needs_no_consent(
    url: str,
) -> None:
    options = oauth_options(url)
    check(options)
    assert options.sasl.warnings() == []


@pytest.mark.parametrize(
    "url",
    ["http://idp.example/token", "http://10.0.0.7:8080/token", "http://0.0.0.0/token",
     "http://localhost.idp.example/token", "http://127.0.0.1.nip.io/token",
     "http://[fe80::1]/token", "http://[::ffff:10.0.0.7]/token"],
)  # fmt: skip
def test_an_http_token_endpoint_elsewhere_is_refused_unless_the_clear_text_is_consented_to(
    url: str,
) -> None:
    """The grant sends the client secret (and the endpoint the token back): over http:// to
    another machine, anyone on the path reads them. `up` refuses, naming the https:// fix
    and the flag that consents; with that flag, it warns instead."""
    with pytest.raises(typer.BadParameter) as refused:
        check(oauth_options(url))
    host = urllib.parse.urlsplit(url).hostname
    assert refused.value.param_hint == "--sasl-token-endpoint"
    assert refused.value.message == (
        f"{url!r} would send the client secret unencrypted to {host}: give the endpoint's "
        "https:// URL, or --sasl-token-endpoint-insecure to send it so all the same")  # fmt: skip
    consented = oauth_options(url, insecure=True)
    check(consented)
    assert consented.sasl.warnings() == [
        f"--sasl-token-endpoint-insecure: the client secret of kafkatunnel and its tokens "
        f"travel unencrypted to {host}: anyone on the path can read them and log in as the "
        "client; give the endpoint's https:// URL instead"]  # fmt: skip


@pytest.mark.parametrize("consent", ["flag", "profile", "variable"])
def test_up_with_consent_to_a_clear_text_token_endpoint_says_so_on_every_start(
    tmp_path: Path, consent: str
) -> None:
    """The consent as a flag, a profile key or a KAFKATUNNEL_ variable: `up` goes on, saying
    that the secret travels in the clear (and stops at the endpoint, whose name is not
    resolved here). Without it, `up` stops before the endpoint is asked."""
    url = "http://idp.invalid/token"
    refused = up_oauth(tmp_path, url)
    assert refused.returncode == 2 and "--sasl-token-endpoint-insecure" in refused.stderr
    assert "cannot reach" not in refused.stderr, refused.stderr  # not asked
    flags, env = [], {}
    if consent == "flag":
        flags = ["--sasl-token-endpoint-insecure"]
    elif consent == "profile":
        (tmp_path / "kafkatunnel.toml").write_text(
            'profile = "p"\n[profiles.p]\nsasl-token-endpoint-insecure = true\n'
        )
    else:
        env = {"KAFKATUNNEL_SASL_TOKEN_ENDPOINT_INSECURE": "1"}
    out = up_oauth(tmp_path, url, *flags, env=env)
    warned = [line for line in out.stdout.splitlines() if line.startswith("warning: ")]
    assert warned == [
        "warning: --sasl-token-endpoint-insecure: the client secret of kafkatunnel and its "
        "tokens travel unencrypted to idp.invalid: anyone on the path can read them and log "
        "in as the client; give the endpoint's https:// URL instead"], out.stdout  # fmt: skip
    assert unreached_at_start(out, url).startswith("the name idp.invalid is not resolved")


class Recorder:
    """A proxy that records each connection and closes it: a stand-in, since only whether
    anything reaches a proxy matters here, not what one would do."""

    def __init__(self) -> None:
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.url = f"http://127.0.0.1:{self.listener.getsockname()[1]}"
        self.accepted = 0
        threading.Thread(target=self._take, daemon=True).start()

    def _take(self) -> None:
        with contextlib.suppress(OSError):  # closed
            while True:
                self.listener.accept()[0].close()
                self.accepted += 1


@pytest.mark.parametrize("scheme", ["http", "https"])
def test_the_environments_proxy_is_never_used_for_the_token_endpoint(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, scheme: str
) -> None:
    """http_proxy, https_proxy and all_proxy name a proxy the grant (and the secret) would
    go through: the token endpoint is asked directly, and the proxy never."""
    proxy = Recorder()
    for variable in ("http_proxy", "https_proxy", "all_proxy"):
        monkeypatch.setenv(variable, proxy.url)
        monkeypatch.setenv(variable.upper(), proxy.url)
    for variable in ("no_proxy", "NO_PROXY"):
        monkeypatch.delenv(variable, raising=False)
    try:
        with https_endpoint(tmp_path, ["127.0.0.1"], "127.0.0.1", tls=scheme == "https") as idp:
            ca = idp.ca if scheme == "https" else None
            endpoint = TokenEndpoint(idp.url, "kafkatunnel", SECRET, None, ca)
            status, body = oauth_token.http_fetch(endpoint, 5.0)
    finally:
        proxy.listener.close()
    assert status == 200 and len(idp.asked) == 1, (status, body)  # reached directly
    assert proxy.accepted == 0
