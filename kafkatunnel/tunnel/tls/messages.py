"""What went wrong with TLS, in words a user can act on: a refused broker certificate (with
what the certificate says), an alert the broker sent about this client, and the facts of
a TLS session that status shows."""

from __future__ import annotations

import contextlib
import datetime
import ssl
from dataclasses import dataclass

# OpenSSL's X509_V_ERR codes (include/openssl/x509_vfy.h) a fix is known for.
EXPIRED, NOT_YET_VALID = 10, 9
UNKNOWN_ISSUER = {2, 18, 19, 20, 21}
NAME_MISMATCH = {62, 64}  # a host name's, an IP address's


def openssl_reason(cause: BaseException) -> str:
    reason = getattr(cause, "reason", None)
    return str(reason or cause).lower().replace("_", " ")


# TLS alerts a broker sends about the client (RFC 8446 6.2), and what to do about them:
# `{cert}` is the client certificate the tunnel presented, as the user named it.
ALERT_FIXES = {
    "certificate required": "the broker refused the certificate of {cert}: check that it is "
    "a client certificate (extended key usage clientAuth) from a CA the broker trusts",
    "unknown ca": "the broker does not trust the CA of {cert}: use a certificate signed by a "
    "CA it trusts (for Strimzi, the clients CA)",
    "bad certificate": "the broker refused the certificate of {cert}: check that it is "
    "a client certificate (extended key usage clientAuth) from a CA the broker trusts",
    "certificate expired": "the certificate of {cert} has expired: renew it",
    "certificate revoked": "the certificate of {cert} was revoked: get a new one",
    "access denied": "the broker refused this client's identity (its ACLs or principal)",
}
# Without a client certificate, OpenSSL's brokers say "certificate required" (TLS 1.3) and
# Java's, Apache Kafka's among them, "bad certificate": a listener with mTLS required.
NO_CERTIFICATE = (
    "the listener requires a client certificate (mTLS) and the tunnel presented none: give "
    "--tls-cert FILE with --tls-key FILE, or --tls-pkcs12 FILE, or with --via kubectl "
    "--kafka-user NAME (a KafkaUser with tls authentication)"
)
WITHOUT_CERTIFICATE = ("certificate required", "bad certificate")


def alert_message(reason: str, certificate: str | None = None) -> str:
    """The broker ended TLS with `reason` (OpenSSL's words): what it means and the fix.
    `certificate`: the client certificate the tunnel presented, as the user named it
    (--tls-cert FILE, --kafka-user NAME), None when it presented none."""
    for words, fix in ALERT_FIXES.items():
        if words in reason:
            if certificate is None and words in WITHOUT_CERTIFICATE:
                fix = NO_CERTIFICATE
            return f"TLS: the broker refused this client ({reason}); fix: " + fix.format(
                cert=certificate or "the client certificate"
            )
    return f"TLS error from the broker: {reason}"


def verification_failure(
    host: str, port: int, error: ssl.SSLCertVerificationError, certificate: bytes | None
) -> str:
    """Why the broker at host:port was not trusted, what its certificate says, and the fix."""
    code = error.verify_code
    what = error.verify_message or openssl_reason(error)
    shown = describe_certificate(certificate) if certificate else None
    lines = [f"TLS: the certificate of {host}:{port} was refused: {what} (name checked: {host})"]
    if shown is not None:
        lines.append(
            f"  its certificate: subject {shown.subject}; "
            f"names {', '.join(shown.names) or 'none'}; issuer {shown.issuer}; "
            f"valid until {shown.not_after:%Y-%m-%d %H:%M} UTC"
        )
    if code in NAME_MISMATCH:
        fix = (
            f"the certificate does not name {host}, the address the cluster advertises: the "
            "broker needs a certificate whose SANs include it (a listener's advertised name)"
        )
    elif code in (EXPIRED, NOT_YET_VALID):
        fix = "the certificate is outside its validity period: renew it (or check this clock)"
    elif code in UNKNOWN_ISSUER:
        fix = "trust the CA that signed it: --tls-ca FILE (its PEM; several may be in one file)"
    else:
        fix = "check the broker's certificate and the CA given with --tls-ca"
    lines.append(f"  fix: {fix}; --tls-insecure turns all checks off, for test clusters only")
    return "\n".join(lines)


@dataclass(frozen=True)
class TlsSession:
    """What a broker's TLS session was: its version and the certificate it showed."""

    version: str
    certificate: CertificateFacts | None

    @classmethod
    def of(cls, version: str, certificate: bytes | None) -> TlsSession:
        return cls(version, describe_certificate(certificate) if certificate else None)

    def as_dict(self) -> dict[str, object]:
        shown = self.certificate
        return {
            "version": self.version,
            "subject": None if shown is None else shown.subject,
            "names": [] if shown is None else shown.names,
            "issuer": None if shown is None else shown.issuer,
            "expires": None if shown is None else shown.not_after.isoformat(),
        }

    def __str__(self) -> str:
        if self.certificate is None:
            return self.version
        return (
            f"{self.version} {self.certificate.subject} until {self.certificate.not_after:%Y-%m-%d}"
        )


@dataclass(frozen=True)
class CertificateFacts:
    subject: str
    names: list[str]  # the subject alternative names, as DNS:... and IP:...
    issuer: str
    not_after: datetime.datetime


def describe_certificate(der: bytes) -> CertificateFacts | None:
    """What a DER certificate says about itself (None: it cannot be read)."""
    from cryptography import x509

    try:
        cert = x509.load_der_x509_certificate(der)
    except ValueError:
        return None
    names: list[str] = []
    with contextlib.suppress(x509.ExtensionNotFound):
        san = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
        names += [f"DNS:{n}" for n in san.get_values_for_type(x509.DNSName)]
        names += [f"IP:{a}" for a in san.get_values_for_type(x509.IPAddress)]
    return CertificateFacts(
        cert.subject.rfc4514_string() or "(empty)",
        names,
        cert.issuer.rfc4514_string() or "(empty)",
        cert.not_valid_after_utc,
    )
