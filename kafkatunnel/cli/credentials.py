"""TLS trust and client credentials read from the cluster with kubectl, for `up --via kubectl
--tls` and `--kafka-user NAME`: the cluster CA when no --tls-ca is given (Strimzi's,
Confluent for Kubernetes' or Bitnami's secret, see kube/cluster_ca.py), and a Strimzi
KafkaUser's certificate or SCRAM password; and the SASL login the flags name
(--sasl-mechanism, its password, or OAUTHBEARER's client secret, read from a file or a
variable, as the user)."""

from __future__ import annotations

import asyncio
import dataclasses
import os
from pathlib import Path

import typer
from rich.console import Console
from rich.markup import escape

from kafkatunnel.cli.output import error
from kafkatunnel.cli.up_options import SaslFlags
from kafkatunnel.kube import cluster_ca, strimzi
from kafkatunnel.kube.cluster_ca import CaSource
from kafkatunnel.kube.forwarder import KubectlForwarder
from kafkatunnel.kube.kubectl import KubectlError
from kafkatunnel.tunnel.login import Credentials
from kafkatunnel.tunnel.oauth_token import TokenEndpoint, TokenSource
from kafkatunnel.tunnel.tls import TlsOptions

Found = tuple[TlsOptions | None, Credentials | None]


def from_cluster(
    console: Console,
    forwarder: KubectlForwarder,
    tls: TlsOptions | None,
    kafka_user: str | None,
    show_password: bool,
) -> Found:
    """`tls` completed from the cluster's secrets (exit 2 with the cause and the fix when
    they cannot be read), and the login of a SCRAM user (with --show-password: none, the
    settings its clients need printed instead)."""
    wants_ca = tls is not None and tls.ca is None and not tls.insecure

    async def read() -> tuple[tuple[bytes, CaSource] | None, strimzi.UserCredentials | None]:
        await forwarder.prepare()
        ca = await cluster_ca.find(forwarder.kubectl, forwarder.pods) if wants_ca else None
        user = await strimzi.kafka_user(forwarder.kubectl, kafka_user) if kafka_user else None
        return ca, user

    try:
        ca, user = asyncio.run(read())
    except KubectlError as cause:
        error(str(cause))
        raise typer.Exit(2) from None
    if ca is not None and tls is not None:
        pem, source = ca
        tls = dataclasses.replace(tls, ca_pem=pem)
        console.print(f"TLS: trusting the cluster CA of {escape(source.convention)} (secret "
                      f"{source.secret}, {source.key})", highlight=False)  # fmt: skip
    elif wants_ca:
        looked = ", ".join(s.secret for s in cluster_ca.sources(forwarder.pods)) or "none"
        said = f"TLS: no cluster CA found in the broker pods' secrets ({looked}): trusting "
        console.print(escape(said + "the system's CAs; --tls-ca FILE names one"), highlight=False)
    if user is not None:
        return _with_user(console, tls, user, show_password)
    return tls, None


def _with_user(
    console: Console, tls: TlsOptions | None, user: strimzi.UserCredentials, show: bool
) -> Found:
    if user.cert_pem is not None:
        if tls is None:
            raise typer.BadParameter(
                f"KafkaUser {user.name} authenticates with a certificate (mTLS): add --tls",
                param_hint="--kafka-user",
            )
        if tls.cert is not None or tls.cert_pem is not None:
            raise typer.BadParameter(
                "--kafka-user and --tls-cert (or --tls-pkcs12) both name a client "
                "certificate: give one",
                param_hint="--kafka-user",
            )
        console.print(
            f"TLS: presenting KafkaUser {escape(user.name)}'s certificate (secret "
            f"{escape(user.secret)}); clients need no credentials of their own",
            highlight=False,
        )
        return dataclasses.replace(tls, cert_pem=user.cert_pem, key_pem=user.key_pem,
                                   cert_pem_from=f"--kafka-user {user.name}"), None  # fmt: skip
    assert user.password is not None and user.mechanism is not None
    if not show:
        console.print(
            f"SASL: the tunnel logs in as KafkaUser {escape(user.name)} with {user.mechanism} "
            f"(secret {escape(user.secret)}); clients need no credentials of their own",
            highlight=False,
        )
        source = f"--kafka-user {user.name}: the password in secret {user.secret}"
        return tls, Credentials(user.mechanism, user.name, user.password, source)
    where = f" -n {user.namespace}" if user.namespace else ""
    password = user.password.decode(errors="replace")
    settings = [
        "security.protocol=SASL_PLAINTEXT",
        f"sasl.mechanism={user.mechanism}",
        f"sasl.username={user.name}",
        f"sasl.password={password}",
    ]
    console.print(
        f"KafkaUser {escape(user.name)} uses {user.mechanism}: clients set", highlight=False
    )
    for line in settings:
        console.print(f"  {escape(line)}", highlight=False, soft_wrap=True)
    console.print(f"(the password is also in secret {escape(user.secret)}{escape(where)}; "
                  "without --show-password the tunnel logs in for the clients)",
                  highlight=False)  # fmt: skip
    return tls, None


def sasl_login(flags: SaslFlags) -> Credentials | None:
    """The login --sasl-mechanism names, its password read (as the user) from the file or
    the variable; None without --sasl-mechanism. Each error names its flag."""
    if flags.mechanism is not None and flags.mechanism.upper() == "OAUTHBEARER":
        return _oauth_login(flags)
    if flags.mechanism is None or flags.username is None:
        return None
    password, source = _secret(flags.password_file, flags.password_env, "password",
                               "--sasl-password")  # fmt: skip
    return Credentials(flags.mechanism.upper(), flags.username, password, source)


def _oauth_login(flags: SaslFlags) -> Credentials:
    """OAUTHBEARER: the client's secret read now; the tokens fetched once the tunnel runs."""
    assert flags.token_endpoint is not None and flags.client_id is not None
    secret, source = _secret(flags.client_secret_file, flags.client_secret_env,
                             "client secret", "--sasl-client-secret")  # fmt: skip
    if flags.token_endpoint_ca is not None:
        try:
            flags.token_endpoint_ca.read_bytes()
        except OSError as cause:
            reason = f"cannot read {flags.token_endpoint_ca}: {cause.strerror or cause}"
            raise typer.BadParameter(reason, param_hint="--sasl-token-endpoint-ca") from None
    endpoint = TokenEndpoint(flags.token_endpoint, flags.client_id, secret, flags.scope,
                             flags.token_endpoint_ca, source)  # fmt: skip
    return Credentials("OAUTHBEARER", flags.client_id, secret, source,
                       tokens=TokenSource(endpoint))  # fmt: skip


def _secret(file: Path | None, variable: str | None, what: str, flags: str) -> tuple[bytes, str]:
    """A secret read (as the user) from `file` or the environment `variable`, and where it
    came from as the flag says it; BadParameter naming `flags`-file or -env."""
    if file is not None:
        flag, source = f"{flags}-file", f"{flags}-file {file}"
        try:
            secret = file.read_bytes().rstrip(b"\r\n")
        except OSError as cause:
            reason = f"cannot read {file}: {cause.strerror or cause}"
            raise typer.BadParameter(reason, param_hint=flag) from None
    else:
        assert variable is not None
        flag, source = f"{flags}-env", f"{flags}-env {variable}"
        value = os.environ.get(variable)
        if value is None:
            raise typer.BadParameter(f"the environment variable {variable} is not set",
                                     param_hint=flag)  # fmt: skip
        secret = value.encode()
    if not secret:
        raise typer.BadParameter(f"the {what} is empty", param_hint=flag)
    return secret, source
