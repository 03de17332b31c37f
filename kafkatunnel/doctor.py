"""`kafkatunnel doctor`: what stands between this laptop and working consumer groups, each
check with its fix. kubectl (installed, a context, the RBAC verbs the tunnel needs), the
brokers' names (with the DNS shim), each broker through the tunnel, and a FindCoordinator +
JoinGroup for a throw-away group coordinated by each broker in turn.

Stands alone at the top: it checks kube, dns and tunnel at once (the command line only
prints what it finds), so it belongs to none of them."""

from __future__ import annotations

import asyncio
import datetime
import ipaddress
import socket
import uuid
from collections.abc import Awaitable, Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

from kafkatunnel.hostnames import join_address, split_address
from kafkatunnel.kube import cluster_ca
from kafkatunnel.kube.forwarder import KubectlForwarder
from kafkatunnel.kube.kubectl import Kubectl, KubectlError, can_i_args
from kafkatunnel.kube.service_forwarder import ServiceForwarder
from kafkatunnel.probe import CLIENT_ID, ProbeConnection
from kafkatunnel.protocol import NOT_COORDINATOR, BrokerAddress

PASS, FAIL, SKIP, WARN = "pass", "fail", "skip", "warn"  # warn: works now, will not for long
CERTIFICATE_WARNING_DAYS = 14
MEMBER_ID_REQUIRED = 79
GROUP_TRIES = 400
DOCTOR_CLIENT = f"{CLIENT_ID}-doctor"  # verify reports its smoke groups apart
RBAC_VERBS = (("get", "pods"), ("list", "pods"), ("create", "pods/portforward"))
Resolve = Callable[[str], list[str]]


@dataclass
class Result:
    check: str
    status: str
    detail: str
    fix: str = ""


@dataclass
class Subject:
    """What doctor checks: a tunnel (or any bootstrap) and, for kubectl, how to call it."""

    bootstrap: str | None = None
    status: dict[str, Any] | None = None  # a running tunnel's status, when there is one
    kubectl: Kubectl | None = None
    names: dict[str, str | None] = field(default_factory=dict)  # broker name -> its address


def system_resolve(name: str) -> list[str]:
    infos = socket.getaddrinfo(name, None, type=socket.SOCK_STREAM)
    return sorted({str(info[4][0]) for info in infos})


def dns_server_resolve(server: str) -> Resolve:
    """Ask one DNS server (the tunnel's shim, say) instead of the system's resolver."""
    from dnslib import QTYPE, DNSRecord

    host, port = split_address(server)

    def resolve(name: str) -> list[str]:
        question = DNSRecord.question(name, "A")  # dnslib sends over IPv4 unless told
        answer = DNSRecord.parse(question.send(host, port, timeout=3, ipv6=":" in host))
        return sorted(str(r.rdata) for r in answer.rr if r.rtype == QTYPE.A)

    return resolve


@dataclass
class StartCheck:
    """What `up --via kubectl` would do at start, tried without starting it: find the broker
    pods (the same namespace choice), then ask the bootstrap broker for ApiVersions through
    a port-forward. Doctor passes if and only if `up` can start."""

    forwarder: KubectlForwarder
    kafka_port: int | None = None
    bootstrap: str | None = None  # the advertised HOST:PORT; default: the first broker pod's
    timeout: float = 15.0


def check_kubectl(kubectl: Kubectl, start: StartCheck | None = None) -> list[Result]:
    try:
        path = kubectl.check_installed()
    except KubectlError as error:
        return [Result("kubectl installed", FAIL, str(error).split(":")[0], str(error))]
    out = [Result("kubectl installed", PASS, path)]
    try:
        context = asyncio.run(kubectl.current_context())
    except KubectlError as error:
        out.append(Result("kubectl context", FAIL, "no usable context", str(error)))
        return out
    out.append(Result("kubectl context", PASS, context))
    found = False
    if start is not None:
        found = _find_brokers(start, out)
        kubectl = start.forwarder.kubectl  # in the namespace up would use
    forwarder = start.forwarder if start is not None and found else None
    out += asyncio.run(_check_permissions(kubectl, forwarder))
    if start is not None and found:
        needed = {f"RBAC: {verb} {resource}" for verb, resource in RBAC_VERBS}
        rbac_ok = all(r.status != FAIL for r in out if r.check in needed)
        out.append(_check_forward(start, rbac_ok=rbac_ok))
    return out


def _find_brokers(start: StartCheck, out: list[Result]) -> bool:
    try:
        asyncio.run(start.forwarder.prepare())
    except KubectlError as error:
        out.append(Result("Kafka broker pods", FAIL, str(error).split(":")[0], str(error)))
        return False
    kubectl = start.forwarder.kubectl
    where = f"namespace {kubectl.namespace}" if kubectl.namespace else "the current namespace"
    names = ", ".join(pod.name for pod in start.forwarder.pods)
    out.append(Result("Kafka broker pods", PASS, f"{names} in {where}"))
    return True


async def _check_permissions(kubectl: Kubectl, forwarder: KubectlForwarder | None) -> list[Result]:
    """The RBAC verbs, and with the broker pods found the CA's secret and the companions:
    every question at once (each is a kubectl of its own, a second or more on a busy
    laptop), answered in this order."""
    where = f" in namespace {kubectl.namespace}" if kubectl.namespace else ""
    asks: list[Awaitable[list[Result]]] = [
        _check_verb(kubectl, verb, resource, where) for verb, resource in RBAC_VERBS
    ]
    asks.append(_check_watch(kubectl, where))
    if forwarder is not None:
        asks += [_check_secrets(forwarder), _check_companions(forwarder)]
    return [result for results in await asyncio.gather(*asks) for result in results]


async def _check_verb(kubectl: Kubectl, verb: str, resource: str, where: str) -> list[Result]:
    name = f"RBAC: {verb} {resource}"
    try:
        allowed = await kubectl.can_i(verb, resource)
    except (KubectlError, TimeoutError, OSError) as error:
        return [Result(name, FAIL, "could not ask", str(error))]
    if allowed:
        return [Result(name, PASS, f"allowed{where}")]
    return [Result(
        name, FAIL, f"forbidden{where}",
        f"ask your cluster admin for a Role granting `{verb}` on `{resource}`{where} "
        f"(check: kubectl {' '.join(can_i_args(verb, resource))})",
    )]  # fmt: skip


async def _check_watch(kubectl: Kubectl, where: str) -> list[Result]:
    """`watch` on pods is optional: with it `up` follows the broker pods as they change;
    without it, it lists them every half second while a broker is down."""
    name = "RBAC: watch pods (optional)"
    try:
        allowed = await kubectl.can_i("watch", "pods")
    except (KubectlError, TimeoutError, OSError) as error:
        return [Result(name, SKIP, "could not ask", str(error))]
    if allowed:
        return [Result(name, PASS, f"allowed{where}: up follows the broker pods as they change")]
    return [Result(
        name, SKIP,
        f"not granted{where}: up lists the pods every half second while a broker is down",
        "for a broker pod made again to be followed the moment it changes, ask for `watch` on "
        f"`pods`{where} (check: kubectl {' '.join(can_i_args('watch', 'pods'))})",
    )]  # fmt: skip


async def _check_secrets(forwarder: KubectlForwarder) -> list[Result]:
    """Where the pods' CA is kept (Strimzi, Confluent for Kubernetes, Bitnami): whether
    `up --tls` can read it itself."""
    found = cluster_ca.sources(forwarder.pods)
    if not found:
        return []
    kubectl, secret = forwarder.kubectl, found[0].secret
    where = f" -n {kubectl.namespace}" if kubectl.namespace else ""
    try:
        allowed = await kubectl.can_i("get", "secrets")
    except (KubectlError, TimeoutError, OSError) as error:
        return [Result("RBAC: get secrets", FAIL, "could not ask", str(error))]
    if allowed:
        return [Result("RBAC: get secrets", PASS, f"up --tls reads the CA from {secret}")]
    key = found[0].key.replace(".", "\\.")
    return [Result(
        "RBAC: get secrets", WARN, f"forbidden: up --tls cannot read secret {secret}{where}",
        f"give the CA with --tls-ca FILE (someone who may: kubectl get secret {secret}{where} "
        f"-o jsonpath='{{.data.{key}}}' | base64 -d > ca.pem), and --tls-cert/--tls-key "
        "instead of --kafka-user",
    )]  # fmt: skip


async def _check_companions(forwarder: KubectlForwarder) -> list[Result]:
    """The services beside the brokers that `up --companions` would forward."""
    services = ServiceForwarder(forwarder, [], discover=True)
    try:
        await services.prepare()
    except KubectlError as error:
        return [Result("companions", WARN, "cannot list services",
                       f"{error} (up --service NAME still forwards one by name)")]  # fmt: skip
    found = [f"{t.kind} {t.name}:{t.port}" for t in services.targets()]
    if not found:
        return [Result("companions", PASS, "none found (Schema Registry, Connect, Kafka Bridge, "
                       "Keycloak); up --service NAME forwards any service")]  # fmt: skip
    return [Result("companions", PASS, f"{', '.join(found)}: up --companions forwards them")]


def check_certificates(
    status: dict[str, Any] | None, now: datetime.datetime | None = None
) -> list[Result]:
    """The brokers' certificates a running tunnel saw (--tls): expired, or expiring soon."""
    now = now or datetime.datetime.now(datetime.UTC)
    expiring: dict[str, datetime.datetime] = {}
    for endpoint in (status or {}).get("endpoints", []):
        session = endpoint.get("tls") or {}
        if session.get("expires") and endpoint.get("node_id") is not None:
            expiring[str(endpoint["advertised"])] = datetime.datetime.fromisoformat(
                session["expires"]
            )
    out = []
    for broker, expires in sorted(expiring.items(), key=lambda item: item[1]):
        left = expires - now
        check, when = f"certificate of {broker}", f"{expires:%Y-%m-%d %H:%M} UTC"
        if left.total_seconds() <= 0:
            out.append(Result(check, FAIL, f"expired {when}", "the cluster must renew it"))
        elif left.days < CERTIFICATE_WARNING_DAYS:
            out.append(Result(check, WARN, f"expires in {left.days} days ({when})",
                              "renew it before then (Strimzi renews its CAs' certificates "
                              "itself: check the renewal period)"))  # fmt: skip
        else:
            out.append(Result(check, PASS, f"valid until {when}"))
    return out


def _check_forward(start: StartCheck, rbac_ok: bool) -> Result:
    """The bootstrap broker through a port-forward, as `up` asks it before serving."""
    from kafkatunnel.tunnel.reachability import Unreachable, reach

    bootstrap = start.bootstrap or start.forwarder.default_bootstrap(start.kafka_port)
    check = "port-forward to the bootstrap"
    if not rbac_ok:
        return Result(check, SKIP, f"{bootstrap}: not tried, see the checks above")
    host, port = split_address(bootstrap)

    async def ask() -> None:
        try:
            await reach(start.forwarder, host, port, start.timeout)
        finally:
            await start.forwarder.close()

    try:
        asyncio.run(ask())
    except Unreachable as cause:
        fix = "check that the broker pods run (`kubectl get pods`) and --bootstrap"
        return Result(check, FAIL, f"{bootstrap}: {cause}", "" if cause.refused else fix)
    return Result(check, PASS, f"{bootstrap} answers ApiVersions through kubectl port-forward")


def check_names(subject: Subject, resolve: Resolve) -> list[Result]:
    """Each broker name resolves to the tunnel's address for it (with the DNS shim)."""
    if not subject.names:
        return [Result("broker names resolve", SKIP,
                       "the tunnel serves no names (rewrite mode without --dns): clients only "
                       "ever see tunnel addresses")]  # fmt: skip
    out = []
    for name, expected in sorted(subject.names.items()):
        check = f"DNS: {name}"
        try:
            found = resolve(name)
        except (OSError, ValueError) as error:
            found, reason = [], str(error)
        else:
            reason = "no address"
        if expected is not None and expected in found:
            out.append(Result(check, PASS, f"-> {expected}"))
        else:
            out.append(Result(
                check, FAIL, f"does not resolve to {expected} ({', '.join(found) or reason})",
                "point your resolver at the tunnel's DNS shim: `kafkatunnel dns setup` (or "
                "`kafkatunnel up --dns`, which does it)",
            ))  # fmt: skip
    return out


def _brokers(bootstrap: str, timeout: float) -> list[BrokerAddress]:
    with ProbeConnection(bootstrap, timeout) as probe:
        return probe.brokers()


def check_brokers(bootstrap: str, timeout: float = 5.0) -> tuple[list[Result], list[int]]:
    """Metadata through the bootstrap, then ApiVersions to each broker at the address the
    client is given."""
    try:
        brokers = _brokers(bootstrap, timeout)
    except (OSError, ValueError) as error:
        fix = "start the tunnel (`kafkatunnel up ...`), or name it with --bootstrap"
        return [Result("bootstrap answers", FAIL, f"{bootstrap}: {error}", fix)], []
    out = [Result("bootstrap answers", PASS, f"{bootstrap}: {len(brokers)} brokers")]
    reachable = []
    for node, host, port in sorted((b.node_id, b.host, b.port) for b in brokers):
        check = f"broker {node} reachable"
        address = join_address(host, port)
        try:
            with ProbeConnection(address, timeout) as probe:
                probe.api_versions()
        except (OSError, ValueError) as error:
            out.append(Result(
                check, FAIL, f"{address}: {error or type(error).__name__}",
                f"the forward to broker {node} is down: see `kafkatunnel status` (its last "
                "error), and the pod or bastion it goes through",
            ))  # fmt: skip
            continue
        reachable.append(node)
        out.append(Result(check, PASS, address))
    return out, reachable


def smoke_group(bootstrap: str, node: int, timeout: float = 10.0) -> Result:
    """FindCoordinator until a throw-away group that broker `node` coordinates turns up,
    then JoinGroup (and LeaveGroup) at the address the answer named."""
    check = f"group on broker {node}"
    prefix = f"kafkatunnel-doctor-{uuid.uuid4().hex[:8]}"
    try:
        with ProbeConnection(bootstrap, timeout, client_id=DOCTOR_CLIENT) as probe:
            found = probe.keys_by_coordinator(prefix, 1, nodes={node}, tries=GROUP_TRIES)
        if not found:
            fix = f"does broker {node} lead any __consumer_offsets partition?"
            detail = f"no group hashes to broker {node} in {GROUP_TRIES} tries"
            return Result(check, FAIL, detail, fix)
        coordinator = found[node]
        group = coordinator.key
        with ProbeConnection(coordinator.address, timeout, client_id=DOCTOR_CLIENT) as probe:
            error, member = probe.join_group_error(group)
            if member:
                probe.leave_group(group, member)
    except (OSError, ValueError) as failure:
        return Result(check, FAIL, f"{type(failure).__name__}: {failure}",
                      "see `kafkatunnel status` for that broker's forward")  # fmt: skip
    if error == NOT_COORDINATOR:
        return Result(
            check, FAIL,
            f"JoinGroup for {group} at {coordinator.address} got NOT_COORDINATOR: that address "
            f"does not lead to broker {node}",
            "use the tunnel's bootstrap.servers (`kafkatunnel up`) instead of a single "
            "port-forward and hosts entries",
        )  # fmt: skip
    if error not in (0, MEMBER_ID_REQUIRED):
        return Result(check, FAIL, f"JoinGroup for {group} got error {error}",
                      "see the broker's logs")  # fmt: skip
    return Result(check, PASS, f"FindCoordinator + JoinGroup for {group} at {coordinator.address}")


def run_checks(
    subject: Subject, resolve: Resolve = system_resolve, start: StartCheck | None = None
) -> list[Result]:
    """All checks; with `start` (no tunnel running yet), whether `up` can start instead of
    the checks that need a running tunnel."""
    results: list[Result] = []
    if subject.kubectl is not None:
        results += check_kubectl(subject.kubectl, start)
    else:
        results.append(Result("kubectl", SKIP, "not used (the tunnel goes --via exec or direct)"))
    if subject.bootstrap is None:
        if start is not None:
            results.append(Result("tunnel running", SKIP, "none: the checks above are what "
                                  "`kafkatunnel up` needs to start; with it up, doctor also "
                                  "checks names, brokers and groups"))  # fmt: skip
            return results
        fix = "start one with `kafkatunnel up ...`, or name it with --bootstrap"
        results.append(Result("tunnel running", FAIL, "no running tunnel found", fix))
        return results
    results += check_names(subject, resolve)
    results += check_certificates(subject.status)
    broker_results, reachable = check_brokers(subject.bootstrap)
    results += broker_results
    with ThreadPoolExecutor(max_workers=max(len(reachable), 1)) as pool:
        results += list(pool.map(lambda n: smoke_group(str(subject.bootstrap), n), reachable))
    return results


def _is_ip(host: str) -> bool:
    try:
        ipaddress.ip_address(host)
    except ValueError:
        return False
    return True


def subject_from_status(status: dict[str, Any], kubectl: Kubectl | None) -> Subject:
    names: dict[str, str | None] = {}
    if status.get("dns"):
        for endpoint in status["endpoints"]:
            if endpoint.get("node_id") is not None:
                host = str(endpoint["advertised"]).rsplit(":", 1)[0].strip("[]")
                if not _is_ip(host):  # brokers that advertise addresses need no names
                    names[host] = endpoint.get("dns_address")
    return Subject(str(status["bootstrap_servers"]), status, kubectl, names)
