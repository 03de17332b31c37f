"""Keycloak, the identity provider of the tests' OAUTHBEARER listener (apache.py's `oauth`):
a real token endpoint (the client credentials grant) and the JWKS endpoint whose keys
Kafka's own OAuthBearerValidatorCallbackHandler checks the tokens with.

Keycloak 26.5.6 (KEYCLOAK_VERSION), because it is the identity provider Strimzi documents
for OAuth and Maven Central serves its server distribution as it is released
(org.keycloak:keycloak-quarkus-dist, a zip), which Java 17 runs. scripts/_setup.sh unpacks
it once into a cache outside the repository and builds it once there for this use
(`kc.sh build --db=dev-mem`: its database in memory, fixed at build time), so a start is
`start --optimized`: no build (start-dev would build again, about 12 s more, into the
shared distribution), no cluster (`--cache=local`: no JGroups ports to collide with another
instance's). Each instance has a home of its own (links to the distribution, its own
conf/ and data/import/), from which it imports the realm this module writes:

    realm `kafka`, the token lifespan LIFESPAN (seconds) unless said otherwise
    client CLIENT_ID (confidential, the client credentials grant only), with an audience
    mapper putting AUDIENCE in its tokens, as Kafka's listener expects
    client BRIEF_CLIENT_ID: the same, its tokens living BRIEF_LIFESPAN seconds
    client ELSEWHERE_CLIENT_ID: the same secret, no audience mapper (a token for some
    other service, which Kafka refuses)

and, in the `master` realm, the administrator ADMIN_USER (password ADMIN_PASSWORD), through
whom tests change the realm while it runs (Keycloak's admin REST API: a client's secret
regenerated, say).

It listens on the host's loopback (where the tunnel asks for tokens, as a laptop reaches an
identity provider) and, for the brokers in their network namespace, `reachable_from`
carries the same address and port there, so both see one URL and one issuer.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import tempfile
import urllib.request
from pathlib import Path

from kafkatunnel.demo.netns import NetworkNamespace
from kafkatunnel.demo.ports import free_port
from kafkatunnel.demo.processes import ManagedProcess
from kafkatunnel.waiting import wait_for

# The version scripts/keycloak/pom.xml names (<keycloak.version>); a test checks they agree.
KEYCLOAK_VERSION = "26.5.6"
HOME_VARIABLE = "KT_KEYCLOAK_HOME"
REALM = "kafka"
AUDIENCE = "kafka"
CLIENT_ID, CLIENT_SECRET = "kafkatunnel", "kafkatunnel-client-s3cret"
BRIEF_CLIENT_ID, BRIEF_LIFESPAN = "kafkatunnel-brief", 20
ELSEWHERE_CLIENT_ID = "kafkatunnel-elsewhere"
LIFESPAN = 300
ADMIN_USER, ADMIN_PASSWORD = "admin", "kafkatunnel-admin-s3cret"
START_TIMEOUT = 120.0
# One JVM beside the brokers: the client compiler only and a small serial heap, as theirs
HEAP = ["-Xms64m", "-Xmx384m", "-XX:+UseSerialGC", "-XX:TieredStopAtLevel=1"]
# What kc.sh gives the JVM (bin/kc.sh of the release)
OPENS = ["--add-opens=java.base/java.util=ALL-UNNAMED",
         "--add-opens=java.base/java.util.concurrent=ALL-UNNAMED",
         "--add-opens=java.base/java.security=ALL-UNNAMED"]  # fmt: skip
ENTRY = "io.quarkus.bootstrap.runner.QuarkusEntryPoint"


class KeycloakUnavailable(RuntimeError):
    """The distribution or a Java to run it is missing; the message says how to get it."""


def keycloak_home() -> Path:
    """The distribution scripts/_setup.sh unpacked and built."""
    configured = os.environ.get(HOME_VARIABLE)
    cache = Path.home() / ".cache" / "kafkatunnel" / f"keycloak-{KEYCLOAK_VERSION}"
    home = Path(configured) if configured else cache
    if not (home / "lib" / "quarkus-run.jar").exists():
        raise KeycloakUnavailable(
            f"Keycloak {KEYCLOAK_VERSION} is not in {home}: scripts/test fetches it from "
            "Maven Central (kt_keycloak in scripts/_setup.sh), or set " + HOME_VARIABLE
        )
    if shutil.which("java") is None:
        raise KeycloakUnavailable("no java on PATH: Keycloak needs Java 17 or 21")
    return home


def realm(lifespan: int = LIFESPAN) -> dict[str, object]:
    """The realm Keycloak imports (see the module's docstring)."""

    def client(client_id: str, audience: bool, lifespan: int | None = None) -> dict[str, object]:
        audience_mapper = {"included.custom.audience": AUDIENCE, "access.token.claim": "true",
                           "id.token.claim": "false"}  # fmt: skip
        mapper = "oidc-audience-mapper"
        mappers = [{"name": "kafka audience", "protocol": "openid-connect",
                    "protocolMapper": mapper, "config": audience_mapper}]  # fmt: skip
        attributes = {} if lifespan is None else {"access.token.lifespan": str(lifespan)}
        return {"clientId": client_id, "enabled": True, "publicClient": False,
                "clientAuthenticatorType": "client-secret", "secret": CLIENT_SECRET,
                "serviceAccountsEnabled": True, "standardFlowEnabled": False,
                "directAccessGrantsEnabled": False, "attributes": attributes,
                "protocolMappers": mappers if audience else []}  # fmt: skip

    return {"realm": REALM, "enabled": True, "sslRequired": "none",
            "accessTokenLifespan": lifespan,
            "clients": [client(CLIENT_ID, True), client(BRIEF_CLIENT_ID, True, BRIEF_LIFESPAN),
                        client(ELSEWHERE_CLIENT_ID, False)]}  # fmt: skip


class Keycloak:
    """`launch()` starts it and returns at once, `wait_ready()` waits for the realm (so
    it can start beside something else); `with Keycloak() as keycloak:` does both. Every
    process and file is gone on `stop()`."""

    def __init__(self, lifespan: int = LIFESPAN, port: int | None = None) -> None:
        self.dist = keycloak_home()
        self.lifespan = lifespan
        self.port = port or free_port()
        self.home = Path(tempfile.mkdtemp(prefix="kafkatunnel-keycloak-"))
        self.process: ManagedProcess | None = None
        self.bridges: list[ManagedProcess] = []

    # -- what clients and brokers are told ----------------------------------------------------

    @property
    def issuer(self) -> str:
        return f"http://127.0.0.1:{self.port}/realms/{REALM}"

    @property
    def token_endpoint(self) -> str:
        return f"{self.issuer}/protocol/openid-connect/token"

    @property
    def jwks_url(self) -> str:
        return f"{self.issuer}/protocol/openid-connect/certs"

    def broker_settings(self) -> dict[str, str]:
        """The brokers' settings that make OAUTHBEARER tokens valid when they carry this
        realm's audience and issuer and are signed with its keys (its JWKS endpoint, which
        Kafka's own validator reads)."""
        return {
            "sasl.oauthbearer.jwks.endpoint.url": self.jwks_url,
            "sasl.oauthbearer.expected.audience": AUDIENCE,
            "sasl.oauthbearer.expected.issuer": self.issuer,
        }

    def jvm_flags(self) -> list[str]:
        """Kafka 4 reaches no OAuth URL the JVM's system property does not allow."""
        return [f"-Dorg.apache.kafka.sasl.oauthbearer.allowed.urls={self.jwks_url}"]

    # -- life cycle -----------------------------------------------------------------------------

    def launch(self) -> Keycloak:
        for linked in ("lib", "providers", "themes"):
            (self.home / linked).symlink_to(self.dist / linked)
        (self.home / "conf").mkdir()
        imports = self.home / "data" / "import"
        imports.mkdir(parents=True)
        (imports / f"{REALM}.json").write_text(json.dumps(realm(self.lifespan)))
        argv = ["java", *HEAP, *OPENS, "-Duser.language=en", "-Duser.country=US",
                f"-Dkc.home.dir={self.home}", f"-Djboss.server.config.dir={self.home / 'conf'}",
                "-Djava.util.logging.manager=org.jboss.logmanager.LogManager",
                "-Dpicocli.disable.closures=true",
                "-cp", str(self.dist / "lib" / "quarkus-run.jar"), ENTRY,
                "start", "--optimized", "--cache=local", "--http-enabled=true",
                "--http-host=127.0.0.1", f"--http-port={self.port}", "--hostname-strict=false",
                "--import-realm"]  # fmt: skip
        admin = {"KC_BOOTSTRAP_ADMIN_USERNAME": ADMIN_USER,
                 "KC_BOOTSTRAP_ADMIN_PASSWORD": ADMIN_PASSWORD}  # fmt: skip
        self.process = ManagedProcess(argv, env=admin, name="keycloak")
        return self

    def wait_ready(self) -> None:
        """Until the realm's discovery document is served (the realm imported), or the
        process died (its output says why)."""
        assert self.process is not None
        process = self.process
        url = f"{self.issuer}/.well-known/openid-configuration"

        def ready() -> bool:
            if not process.alive():
                raise RuntimeError(f"keycloak exited:\n{process.output()[-3000:]}")
            try:
                with urllib.request.urlopen(url, timeout=2) as answer:
                    return int(answer.status) == 200
            except OSError:
                return False

        wait_for(ready, timeout=START_TIMEOUT, interval=0.3, what="Keycloak to start")

    def reachable_from(self, namespace: NetworkNamespace) -> None:
        """The same address and port inside `namespace`: a socat there carries each
        connection back to this one's network (nsenter into this process's)."""
        here = f"/proc/{os.getpid()}/ns/net"
        back = f"nsenter --net={here} socat STDIO TCP\\:127.0.0.1\\:{self.port}"
        bridge = ManagedProcess(
            [*namespace.exec_prefix(), "socat",
             f"TCP-LISTEN:{self.port},bind=127.0.0.1,fork,reuseaddr", f"EXEC:{back}"],
            name="keycloak-bridge",
        )  # fmt: skip
        self.bridges.append(bridge)
        bridge.wait_accepting(self.port, timeout=10, connect=namespace.connect)

    def start(self) -> Keycloak:
        try:
            self.launch().wait_ready()
        except BaseException:
            self.stop()
            raise
        return self

    def stop(self) -> None:
        for process in [*self.bridges, *([self.process] if self.process else [])]:
            with contextlib.suppress(Exception):
                process.stop(timeout=10)
        self.bridges.clear()
        self.process = None
        shutil.rmtree(self.home, ignore_errors=True)

    def __enter__(self) -> Keycloak:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()
