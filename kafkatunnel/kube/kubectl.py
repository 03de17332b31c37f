"""Running the user's own kubectl (with its contexts and auth plugins) and turning its
failures into messages that say what is wrong and what to do."""

from __future__ import annotations

import asyncio
import contextlib
import json
import re
import shutil
from dataclasses import dataclass, field
from typing import Any

from kafkatunnel.pids import die_with_parent


def can_i_args(verb: str, resource: str) -> tuple[str, ...]:
    """kubectl's question for a verb on a resource. A subresource goes in --subresource:
    `kubectl auth can-i create pods/portforward` asks about a pod NAMED portforward, which
    a Role granting pods/portforward does not allow, so the answer would be a wrong no."""
    kind, _, subresource = resource.partition("/")
    extra = (f"--subresource={subresource}",) if subresource else ()
    return ("auth", "can-i", verb, kind, *extra)


class KubectlError(RuntimeError):
    """kubectl could not do what the tunnel needs; the message names the cause and the fix.

    `permanent`: trying again cannot help (RBAC said no), so nobody should wait for it.
    `pending`: the pod is on its way (starting, not ready yet): ask again soon, not later."""

    def __init__(self, message: str, *, permanent: bool = False, pending: bool = False) -> None:
        super().__init__(message)
        self.permanent = permanent
        self.pending = pending


FORBIDDEN = re.compile(
    r'User "(?P<user>[^"]*)" cannot (?P<verb>\w+) resource "(?P<resource>[^"]+)"'
    r'(?: in API group "[^"]*")?(?: in the namespace "(?P<namespace>[^"]*)")?'
)
NOT_FOUND = re.compile(
    r'Error from server \(NotFound\): (?P<kind>[\w.]+) "(?P<name>[^"]+)" not found'
)
# client-go's exec credential plugins (GKE, EKS, AKS, OIDC logins), as kubectl 1.20-1.33 say
PLUGIN_MISSING = re.compile(r"getting credentials: exec: executable (?P<plugin>\S+) not found")
PLUGIN_FAILED = re.compile(
    r"getting credentials: exec: executable (?P<plugin>\S+) failed with exit code (?P<code>\d+)"
)
PLUGIN_DOCS = "client-go-credential-plugins"  # the line before the kubeconfig's installHint
NO_CONTEXT = re.compile(
    r"context was not found for specified context: (?P<context>\S+)"
    r'|context "(?P<named>[^"]+)" does not exist'
)
UNAUTHORIZED = "You must be logged in to the server"
KLOG = re.compile(r"[IWEF]\d{4} \d\d:\d\d:\d\d\.\d+ ")  # kubectl's own log lines
LOG_IN_AGAIN = (
    "log in again the way your cluster wants it (e.g. `gcloud auth login`, `aws sso login`, "
    "`az login`, or a fresh kubeconfig), then check with `kubectl get pods`"
)


@dataclass(frozen=True)
class Kubectl:
    """The kubectl command line every call shares: binary, kubeconfig, context, namespace."""

    binary: str = "kubectl"
    kubeconfig: str | None = None
    context: str | None = None
    namespace: str | None = None
    extra: tuple[str, ...] = field(default_factory=tuple)

    def argv(self, *args: str) -> list[str]:
        base = [self.binary]
        if self.kubeconfig:
            base += ["--kubeconfig", self.kubeconfig]
        if self.context:
            base += ["--context", self.context]
        if self.namespace:
            base += ["--namespace", self.namespace]
        return [*base, *self.extra, *args]

    def check_installed(self) -> str:
        path = shutil.which(self.binary)
        if path is None:
            raise KubectlError(
                f"kubectl not found ({self.binary!r} is not on PATH): install it "
                "(https://kubernetes.io/docs/tasks/tools/) or use --via exec / --via direct"
            )
        return path

    async def run(self, *args: str, timeout: float = 30.0) -> str:
        returncode, out, err = await self._call(args, timeout)
        if returncode != 0:
            raise explain(err.decode(errors="replace"), args)
        return out.decode()

    async def can_i(self, verb: str, resource: str, timeout: float = 30.0) -> bool:
        """`kubectl auth can-i`: it prints yes (exit 0) or no (exit 1)."""
        args = can_i_args(verb, resource)
        _returncode, out, err = await self._call(args, timeout)
        answer = out.decode().strip().splitlines()[:1]
        if answer and answer[0].startswith(("yes", "no")):
            return answer[0].startswith("yes")
        raise explain(err.decode(errors="replace"), args)

    async def start(self, *args: str) -> asyncio.subprocess.Process:
        """A kubectl that runs as long as the tunnel needs it (a port-forward, a watch): its
        output piped to the caller, and killed by the kernel if the tunnel dies, so none is
        left behind."""
        return await asyncio.create_subprocess_exec(
            *self.argv(*args),
            stdin=asyncio.subprocess.DEVNULL,
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.PIPE,
            preexec_fn=die_with_parent,
        )

    async def _call(self, args: tuple[str, ...], timeout: float) -> tuple[int, bytes, bytes]:
        """kubectl's exit code and output. A kubectl that does not answer in time, or whose
        caller is cancelled (up stopping), is killed and reaped: it never outlives the call."""
        self.check_installed()
        process = await asyncio.create_subprocess_exec(
            *self.argv(*args),
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.PIPE,
        )
        try:
            out, err = await asyncio.wait_for(process.communicate(), timeout)
        except TimeoutError:
            raise KubectlError(
                f"`kubectl {' '.join(args)}` did not answer within {timeout:g}s "
                "(is the cluster reachable? try `kubectl get pods` yourself)"
            ) from None
        finally:
            if process.returncode is None:
                with contextlib.suppress(ProcessLookupError):
                    process.kill()
                await process.wait()
        return process.returncode or 0, out, err

    async def get_json(self, *args: str) -> Any:
        return json.loads(await self.run("get", *args, "-o", "json"))

    async def current_context(self) -> str:
        if self.context:
            return self.context
        return (await self.run("config", "current-context")).strip()


def explain(stderr: str, args: tuple[str, ...] | list[str]) -> KubectlError:
    """A KubectlError naming the cause and the fix, from kubectl's own error output."""
    text = stderr.strip()
    command = "kubectl " + " ".join(args)
    if "current-context is not set" in text:
        return KubectlError(
            "kubectl has no current context: choose one with `kubectl config use-context NAME` "
            "or pass --context (see `kubectl config get-contexts`)"
        )
    forbidden = FORBIDDEN.search(text)
    if forbidden:
        verb, resource = forbidden["verb"], forbidden["resource"]
        where = f' in namespace "{forbidden["namespace"]}"' if forbidden["namespace"] else ""
        return KubectlError(
            f'RBAC forbids {verb} {resource}{where} for user "{forbidden["user"]}": the tunnel '
            f"needs get/list pods and create pods/portforward; ask your cluster admin for a Role "
            f"granting `{verb}` on `{resource}` (kubectl {' '.join(can_i_args(verb, resource))})",
            permanent=True,
        )
    credentials = _explain_credentials(text)
    if credentials is not None:
        return credentials
    missing = NOT_FOUND.search(text)
    if missing:
        kind, name = missing["kind"], missing["name"]
        if kind == "namespaces":
            return KubectlError(
                f'namespace "{name}" not found: check --namespace (kubectl get namespaces)'
            )
        return KubectlError(
            f'{kind.split(".")[0].rstrip("s")} "{name}" not found: check --target '
            "(kubectl get statefulsets,services)"
        )
    if "connection refused" in text or "Unable to connect to the server" in text:
        return KubectlError(
            f"kubectl cannot reach the cluster's API server (`{command}`): {text.splitlines()[-1]}"
        )
    last = text.splitlines()[-1] if text else "no error output"
    return KubectlError(f"`{command}` failed: {last}")


def _explain_credentials(text: str) -> KubectlError | None:
    """A context kubectl cannot use: not in the kubeconfig, its credential plugin missing or
    failing, or its credentials refused. Trying again does not help: each is permanent."""
    context = NO_CONTEXT.search(text)
    if context:
        name = context["context"] or context["named"]
        return KubectlError(
            f'no context "{name}" in your kubeconfig: list them with '
            "`kubectl config get-contexts` and pass one with --context",
            permanent=True,
        )
    missing = PLUGIN_MISSING.search(text)
    if missing:
        plugin = missing["plugin"]
        hint = " ".join(text.split(PLUGIN_DOCS, 1)[1].split()) if PLUGIN_DOCS in text else ""
        return KubectlError(
            f"kubectl needs the credential plugin `{plugin}` for this context, and it is not "
            f"installed: {hint or 'install it'} (or choose another context: kubectl config "
            "get-contexts)",
            permanent=True,
        )
    failed = PLUGIN_FAILED.search(text)
    if failed:
        said = [
            line.strip()
            for line in text.splitlines()
            if line.strip() and "getting credentials: exec:" not in line and not KLOG.match(line)
        ]
        why = f": {said[0]}" if said else ""
        return KubectlError(
            f"kubectl's credential plugin `{failed['plugin']}` failed (exit {failed['code']})"
            f"{why}; {LOG_IN_AGAIN}",
            permanent=True,
        )
    if UNAUTHORIZED in text:
        return KubectlError(
            "the cluster refused kubectl's credentials (Unauthorized: they expired or were "
            f"revoked); {LOG_IN_AGAIN}",
            permanent=True,
        )
    return None
