"""The SASL mechanisms the tunnel logs in with, as the client side of each conversation:
what the client says first, and what it answers to each server message, until it has
nothing more to say. Sans-I/O: bytes in, bytes out; the Kafka frames around them are
sasl_login's.

- PLAIN (RFC 4616): one message, the user name and the password.
- SCRAM-SHA-256 and SCRAM-SHA-512 (RFC 5802, RFC 7677): two round trips, and the server
  proves it knows the password too. Written here with hashlib and hmac rather than taken
  from a SCRAM library: Kafka hashes the password's UTF-8 bytes as they are (its
  ScramFormatter does no SASLprep), where a library that SASLpreps (scramp does, always)
  derives another key for a password SASLprep changes, and refuses some Kafka accepts.
- OAUTHBEARER (RFC 7628): one message carrying a bearer token, as Kafka's
  OAuthBearerSaslClient sends it; the token is an input (fetched elsewhere, by the I/O
  layer). A broker that refuses the token says why in a challenge; the client answers
  `%x01`, as RFC 7628 3.2.3 says, so that the broker ends the exchange with its error.

Secrets stay inside the mechanism: its repr shows the user, never the password or the
token, and the salted password is kept (per salt and iteration count, as the broker names
them) only so that each new connection does not spend milliseconds of the event loop
deriving it again.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import hmac
import os
import re
from abc import ABC, abstractmethod
from collections.abc import Callable

from kafkatunnel.protocol.untrusted_text import one_line


class MechanismError(Exception):
    """The server's message cannot be answered: malformed, or it does not prove the server
    knows the password. The message says which."""


class Mechanism(ABC):
    """A client's side of one SASL conversation. `name` is the mechanism's SASL name;
    `principal` the user it logs in as (for messages and status, never a secret)."""

    name: str
    principal: str

    @abstractmethod
    def first(self) -> bytes:
        """The client's first message (a new conversation each call)."""

    @abstractmethod
    def answer(self, challenge: bytes) -> bytes | None:
        """The reply to the server's message; None once the client has nothing more to say
        (the login is complete on the client's side). MechanismError if it cannot reply."""

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.name} as {self.principal!r})"


class Plain(Mechanism):
    """PLAIN: `authzid NUL authcid NUL password`, with no authzid (Kafka's own client)."""

    name = "PLAIN"

    def __init__(self, username: str, password: bytes) -> None:
        self.principal = username
        self._password = password

    def first(self) -> bytes:
        return b"\0" + self.principal.encode() + b"\0" + self._password

    def answer(self, challenge: bytes) -> bytes | None:
        return None  # the server's answer to the one message ends it


SCRAM_HASHES = {"SCRAM-SHA-256": "sha256", "SCRAM-SHA-512": "sha512"}  # hashlib's names
# Iteration counts a server may ask for: fewer is weaker than any Kafka allows (its
# minimum, 4096, is RFC 7677's); more costs the tunnel a derivation it has no reason to
# pay (Kafka's maximum is 16384).
MIN_ITERATIONS, MAX_ITERATIONS = 4096, 100_000
GS2_HEADER = b"n,,"  # no channel binding, no authzid
NONCE_BYTES = 24


class Scram(Mechanism):
    """SCRAM-SHA-256 or SCRAM-SHA-512, RFC 5802's client: client-first, then the proof,
    then the server's signature checked."""

    def __init__(
        self,
        name: str,
        username: str,
        password: bytes,
        nonce: Callable[[], bytes] | None = None,
        salted: dict[tuple[bytes, int], bytes] | None = None,
    ) -> None:
        """`salted`: where derived keys are kept, shared by the conversations of one user
        (each connection has its own Scram; the derivation is the same for all)."""
        if name not in SCRAM_HASHES:
            raise ValueError(f"{name} is not one of {', '.join(SCRAM_HASHES)}")
        self.name = name
        self.principal = username
        self._password = password
        self._hash = SCRAM_HASHES[name]
        self._nonce = nonce or _random_nonce
        self._salted = {} if salted is None else salted  # (salt, iterations) -> key
        self._client_first_bare = b""
        self._server_signature: bytes | None = None
        self._state = "new"

    def first(self) -> bytes:
        nonce = self._nonce()
        if not nonce or not all(0x21 <= c <= 0x7E and c != 0x2C for c in nonce):
            raise ValueError("a SCRAM nonce is printable ASCII without a comma")
        self._client_first_bare = b"n=" + _sasl_name(self.principal) + b",r=" + nonce
        self._server_signature = None
        self._state = "first sent"
        return GS2_HEADER + self._client_first_bare

    def answer(self, challenge: bytes) -> bytes | None:
        if self._state == "first sent":
            self._state = "final sent"
            return self._client_final(challenge)
        if self._state == "final sent":
            self._state = "done"
            self._check_server_final(challenge)
            return None
        raise MechanismError(f"a SCRAM message after the conversation ended ({self._state})")

    def _client_final(self, server_first: bytes) -> bytes:
        fields = _attributes(server_first, "server-first")
        if "m" in fields:
            raise MechanismError("the server asks for a SCRAM extension this client lacks")
        nonce, salt_text, iterations_text = (fields.get(k) for k in ("r", "s", "i"))
        if nonce is None or salt_text is None or iterations_text is None:
            raise MechanismError("the server-first message lacks its nonce, salt or count")
        client_nonce = self._client_first_bare.rpartition(b",r=")[2]
        if not nonce.startswith(client_nonce) or len(nonce) == len(client_nonce):
            raise MechanismError("the server's nonce does not extend the client's")
        try:
            salt = base64.b64decode(salt_text, validate=True)
        except (binascii.Error, ValueError):
            raise MechanismError("the server's salt is not base64") from None
        if not (iterations_text.isdigit() and len(iterations_text) <= 9):
            raise MechanismError("the server's iteration count is not a number")
        iterations = int(iterations_text)
        if not MIN_ITERATIONS <= iterations <= MAX_ITERATIONS:
            raise MechanismError(f"the server asks for {iterations} iterations; a client "
                                 f"accepts {MIN_ITERATIONS} to {MAX_ITERATIONS}")  # fmt: skip
        salted = self._salted_password(salt, iterations)
        without_proof = b"c=" + base64.b64encode(GS2_HEADER) + b",r=" + nonce
        auth_message = b",".join((self._client_first_bare, server_first, without_proof))
        client_key = self._hmac(salted, b"Client Key")
        stored_key = hashlib.new(self._hash, client_key).digest()
        signature = self._hmac(stored_key, auth_message)
        proof = bytes(a ^ b for a, b in zip(client_key, signature, strict=True))
        self._server_signature = self._hmac(self._hmac(salted, b"Server Key"), auth_message)
        return without_proof + b",p=" + base64.b64encode(proof)

    def _check_server_final(self, server_final: bytes) -> None:
        fields = _attributes(server_final, "server-final")
        if "e" in fields:
            said = one_line(fields["e"])
            raise MechanismError(f"the server ended the SCRAM exchange: {said}")
        verifier = fields.get("v")
        try:
            signature = base64.b64decode(verifier or b"", validate=True)
        except (binascii.Error, ValueError):
            signature = b""
        assert self._server_signature is not None
        if not hmac.compare_digest(signature, self._server_signature):
            raise MechanismError(
                "the server's SCRAM signature does not verify: it does not know this "
                "user's password (a server that is not the cluster's?)"
            )

    def _salted_password(self, salt: bytes, iterations: int) -> bytes:
        key = (salt, iterations)
        if key not in self._salted:
            derived = hashlib.pbkdf2_hmac(self._hash, self._password, salt, iterations)
            self._salted.clear()  # one user, one salt: the newest is kept
            self._salted[key] = derived
        return self._salted[key]

    def _hmac(self, key: bytes, message: bytes) -> bytes:
        return hmac.new(key, message, self._hash).digest()


def _random_nonce() -> bytes:
    return base64.b64encode(os.urandom(NONCE_BYTES))


def _sasl_name(name: str) -> bytes:
    """RFC 5802's saslname: `=` and `,` escaped, as Kafka's ScramFormatter does."""
    return name.replace("=", "=3D").replace(",", "=2C").encode()


def _attributes(message: bytes, what: str) -> dict[str, bytes]:
    """A SCRAM message's `a=value` attributes (each a single letter)."""
    fields: dict[str, bytes] = {}
    for part in message.split(b","):
        name, sep, value = part.partition(b"=")
        if not sep or len(name) != 1 or not name.isalpha():
            shown = message[:80].decode("ascii", "replace")
            raise MechanismError(f"the {what} message is not SCRAM: {shown!r}")
        fields.setdefault(name.decode(), value)
    return fields


GS2_CONTROL_A = b"\x01"  # RFC 7628's separator, and the client's answer to an error
# RFC 6750's b64token: what a bearer token may hold (so it cannot break the message)
BEARER_TOKEN = re.compile(rb"[A-Za-z0-9\-._~+/]+=*")


class OAuthBearer(Mechanism):
    """OAUTHBEARER: `n,,^Aauth=Bearer <token>^A^A` (no authzid, no extensions), as Kafka's
    client sends it. `principal`: who the token stands for, for messages only."""

    name = "OAUTHBEARER"

    def __init__(self, principal: str, token: str) -> None:
        self.principal = principal
        self._token = token.encode("ascii", "replace")
        self._state = "new"

    def first(self) -> bytes:
        if not BEARER_TOKEN.fullmatch(self._token):
            raise ValueError("the token is not a bearer token (RFC 6750's b64token)")
        self._state = "sent"
        control = GS2_CONTROL_A
        return GS2_HEADER + control + b"auth=Bearer " + self._token + control + control

    def answer(self, challenge: bytes) -> bytes | None:
        if self._state == "sent":
            if not challenge:
                self._state = "done"
                return None  # the broker took the token
            self._state = "error answered"
            return GS2_CONTROL_A  # the broker's error message: it ends with its error next
        raise MechanismError(f"an OAUTHBEARER message after the conversation ended "
                             f"({self._state})")  # fmt: skip
