"""Root for as long as it is needed, and not a moment longer.

`sudo kafkatunnel up --dns` needs root for two things: binding port 53, and pointing the
machine's resolver at the shim (and undoing it). Everything else, the part that reads what
the cluster sends, runs as the user who typed sudo:

    root (SUDO_UID/SUDO_GID set)
      binds the DNS port -> forks --+-- the child drops to the user (groups, gid, uid),
      |                             |   runs the tunnel, asks for the resolver set-up once
      |                             |   its brokers are known
      +-- the parent: does nothing but that set-up and its teardown, for names it checks
          again (host names, inside the cluster's zones), and undoes it when the child ends

The two talk over a socketpair, one JSON line each way per request: the parent trusts the
child no more than the cluster (it reads what brokers say), so it checks every field of a
request (`checked_setup`) and refuses, saying so, whatever the tunnel would never send.
"""

from __future__ import annotations

import contextlib
import ipaddress
import json
import os
import pwd
import signal
import socket
import stat
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from kafkatunnel.dns.resolver import METHODS, Plan, ResolverError, setup, teardown
from kafkatunnel.hostnames import ClusterZones, UntrustedName, check_port, is_ip_literal


@dataclass(frozen=True)
class User:
    """Whom sudo was run by."""

    uid: int
    gid: int
    name: str
    home: str


def invoking_user(environ: dict[str, str] | None = None) -> User | None:
    """The user behind `sudo` when we run as root through it, else None."""
    env = os.environ if environ is None else environ
    uid, gid = env.get("SUDO_UID", ""), env.get("SUDO_GID", "")
    if os.geteuid() != 0 or not uid.isdigit() or not gid.isdigit() or int(uid) == 0:
        return None
    try:
        entry = pwd.getpwuid(int(uid))
    except KeyError:
        return User(int(uid), int(gid), env.get("SUDO_USER", uid), "/")
    return User(int(uid), int(gid), entry.pw_name, entry.pw_dir)


def drop_to(user: User) -> None:
    """Become `user` for good (supplementary groups, gid, then uid), with the environment
    a login of theirs would have for what we use of it: HOME (kubeconfig), the runtime
    directory (state files). Raises if root could be regained."""
    os.setgroups(os.getgrouplist(user.name, user.gid) if user.name else [user.gid])
    os.setgid(user.gid)
    os.setuid(user.uid)
    try:
        os.setuid(0)
    except PermissionError:
        pass
    else:
        raise RuntimeError("dropping root failed: setuid(0) still works")
    os.environ.update(HOME=user.home, USER=user.name, LOGNAME=user.name)
    runtime = Path(f"/run/user/{user.uid}")
    if runtime.is_dir() and runtime.stat().st_uid == user.uid:
        os.environ["XDG_RUNTIME_DIR"] = str(runtime)
    else:
        os.environ.pop("XDG_RUNTIME_DIR", None)


def unreadable_installation(user: User) -> str | None:
    """Why `user` could not run this kafkatunnel once root is dropped (None: they can).

    The tunnel goes on in this very process as the user, and Python imports lazily: an
    interpreter, standard library or package in a directory the user may not enter (a
    pyenv Python under /root, mode 0700) fails later, at the first import past the drop.
    Checked here, by the permission bits, for what the drop keeps using: the interpreter,
    every file of this package, and the entries of sys.path that imports so far came from
    (a library directory Python names but never made, such as a fresh Debian's
    dist-packages, is not used, and no reason to stop)."""
    groups = set(os.getgrouplist(user.name, user.gid)) if user.name else {user.gid}
    wanted = [(Path(sys.executable), READ | EXECUTE, "the Python interpreter")]
    package = Path(__file__).parent
    for path in [package, *sorted(package.rglob("*"))]:
        if "__pycache__" not in path.relative_to(package).parts:  # Python rebuilds those
            need = READ | EXECUTE if path.is_dir() else READ
            wanted.append((path, need, "the kafkatunnel package"))
    for entry in _used_path_entries():
        need = READ | EXECUTE if entry.is_dir() else READ  # a directory, or a zip archive
        wanted.append((entry, need, "Python's libraries"))
    for path, need, what in wanted:
        blocked = _blocked(path.resolve(), need, user.uid, groups)
        if blocked is not None:
            return f"{user.name} cannot read {what} at {path}: {blocked}"
    return None


def _used_path_entries() -> list[Path]:
    """The entries of sys.path that hold a module this process has imported (the closest
    entry of each, where one lies inside another): where the imports still to come are
    found."""
    entries = [os.path.join(os.path.abspath(entry), "") for entry in sys.path]
    used: dict[Path, None] = {}
    for module in list(sys.modules.values()):
        file = getattr(module, "__file__", None)
        if isinstance(file, str):
            holders = [e for e in entries if file.startswith(e)]
            if holders:
                used[Path(max(holders, key=len))] = None
    return list(used)


READ, EXECUTE = 4, 1


def _blocked(path: Path, need: int, uid: int, groups: set[int]) -> str | None:
    """Where the path is closed to the user: an ancestor they may not enter, or the path
    itself without the `need` bits for them (owner, group, then other bits, as the kernel
    checks them); None when open."""
    for step, bits in [*((p, EXECUTE) for p in reversed(path.parents)), (path, need)]:
        try:
            info = step.stat()
        except OSError as cause:
            return f"{step}: {cause.strerror}"
        if uid == info.st_uid:
            granted = info.st_mode >> 6 & 7
        elif info.st_gid in groups:
            granted = info.st_mode >> 3 & 7
        else:
            granted = info.st_mode & 7
        if granted & bits != bits:
            mode = stat.filemode(info.st_mode)
            owner = _owner(info.st_uid)
            return f"{step} is {mode}, owned by {owner}"
    return None


def _owner(uid: int) -> str:
    try:
        return pwd.getpwuid(uid).pw_name
    except KeyError:
        return str(uid)


class ResolverChannel:
    """The child's side: asks the root parent to set up (and tear down) the resolver."""

    def __init__(self, sock: socket.socket) -> None:
        self.sock = sock
        self.file = sock.makefile("rw", encoding="utf-8")

    def setup(self, *, method: str, names: dict[str, str], domains: list[str],
              server: tuple[str, int]) -> Plan:  # fmt: skip
        answer = self._ask({"setup": {"method": method, "names": names, "domains": domains,
                                      "server": list(server)}})  # fmt: skip
        return Plan(answer["method"], answer["steps"], answer["notes"])

    def teardown(self) -> list[str]:
        """Undo the set-up (the parent also does, should this process die first)."""
        steps: list[str] = self._ask({"teardown": True})["steps"]
        return steps

    def _ask(self, request: dict[str, Any]) -> dict[str, Any]:
        self.file.write(json.dumps(request) + "\n")
        self.file.flush()
        line = self.file.readline()
        if not line:
            raise ResolverError("the privileged helper is gone")
        answer: dict[str, Any] = json.loads(line)
        if "error" in answer:
            raise ResolverError(answer["error"])
        return answer


def split_privileges(
    user: User, zones: ClusterZones, child_only: list[socket.socket] | None = None
) -> ResolverChannel:
    """Fork. The child returns, as `user`, with the channel to the parent. The parent
    (root) serves resolver requests until the child ends, undoes them, and exits with the
    child's status: it never returns. `child_only`: sockets the parent closes."""
    parent_end, child_end = socket.socketpair()
    sys.stdout.flush()
    sys.stderr.flush()
    pid = os.fork()
    if pid == 0:
        parent_end.close()
        drop_to(user)
        return ResolverChannel(child_end)
    child_end.close()
    for sock in child_only or []:
        sock.close()
    _root_state_dir()
    for signum in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
        signal.signal(signum, lambda number, _: _forward(pid, number))
    configured = False
    try:
        with parent_end.makefile("rw", encoding="utf-8") as channel:
            while line := channel.readline(MAX_REQUEST):
                answer, done = _serve(line, zones)
                configured = (configured or done == "setup") and done != "teardown"
                channel.write(json.dumps(answer) + "\n")
                channel.flush()
                if not line.endswith("\n"):  # cut at MAX_REQUEST: the rest is no request
                    break
    except (OSError, ValueError):
        pass  # the child went away mid-line: undo what it asked for, below
    finally:
        if configured:
            for step in teardown():
                print(f"resolver: {step}", file=sys.stderr, flush=True)
        status = _wait(pid)
    os._exit(status)


def _root_state_dir() -> None:
    """The helper's resolver journal goes where root's own commands look for it (`sudo
    kafkatunnel dns teardown` after a crash), never into a directory of the user's."""
    explicit = os.environ.get("KAFKATUNNEL_STATE_DIR")
    with contextlib.suppress(OSError):
        if explicit and Path(explicit).stat().st_uid == 0:
            return
    os.environ.pop("XDG_RUNTIME_DIR", None)
    os.environ["KAFKATUNNEL_STATE_DIR"] = str(Path(pwd.getpwuid(0).pw_dir) / ".kafkatunnel" / "run")


def _forward(pid: int, signum: int) -> None:
    with contextlib.suppress(ProcessLookupError):
        os.kill(pid, signum)


def _wait(pid: int) -> int:
    while True:
        try:
            _, status = os.waitpid(pid, 0)
        except InterruptedError:
            continue
        except ChildProcessError:
            return 1
        return os.waitstatus_to_exitcode(status) & 0xFF


MAX_REQUEST = 1 << 20  # bytes of one request line: ample for the brokers we serve
MAX_NAMES = 4096  # names in one set-up (the tunnel serves at most --max-brokers brokers)


@dataclass(frozen=True)
class SetupRequest:
    """A set-up the child asked for, every field checked."""

    method: str
    names: dict[str, str]
    domains: list[str]
    server: tuple[str, int]


def checked_setup(asked: object, zones: ClusterZones) -> SetupRequest:
    """The child's set-up request if every field is what the tunnel itself would send, else
    UntrustedName saying which is not: the method one of METHODS; each name a form of a
    name inside the cluster's zones, resolving to a loopback address; each domain one the
    zones allow; the server a loopback IP literal and a port."""
    if not isinstance(asked, dict) or set(asked) != {"method", "names", "domains", "server"}:
        raise UntrustedName("a set-up needs exactly method, names, domains and server")
    method, names, domains, server = (asked[k] for k in ("method", "names", "domains", "server"))
    if not isinstance(method, str) or method not in METHODS:
        raise UntrustedName(f"method {str(method)[:40]!r} is not one of {', '.join(METHODS)}")
    if not isinstance(names, dict) or not all(
        isinstance(k, str) and isinstance(v, str) for k, v in names.items()
    ):
        raise UntrustedName("names must map host names to addresses")
    if not isinstance(domains, list) or not all(isinstance(d, str) for d in domains):
        raise UntrustedName("domains must be a list of domain names")
    if len(names) > MAX_NAMES or len(domains) > MAX_NAMES:
        raise UntrustedName(f"more than {MAX_NAMES} names or domains")
    for name, address in names.items():
        _loopback(address, f"the address of {name[:80]!r}")
    if not (isinstance(server, list) and len(server) == 2 and isinstance(server[0], str)
            and type(server[1]) is int):  # fmt: skip
        raise UntrustedName("server must be [address, port]")
    host, port = _loopback(server[0], "the DNS server"), check_port(server[1])
    why = zones.refusal(names, domains)
    if why is not None:
        raise UntrustedName(why)
    return SetupRequest(method, dict(names), list(domains), (host, port))


def _loopback(address: str, what: str) -> str:
    """`address` if it is an IP literal on this machine's loopback (127/8, ::1)."""
    try:
        if is_ip_literal(address) and ipaddress.ip_address(address).is_loopback:
            return address
    except ValueError:
        pass
    raise UntrustedName(f"{what} must be a loopback address, not {address[:60]!r}")


def _serve(line: str, zones: ClusterZones) -> tuple[dict[str, Any], str | None]:
    """One request from the child: (the answer, what was done). A request the tunnel would
    never send is refused, and said on root's standard error."""
    try:
        if len(line) >= MAX_REQUEST:
            raise UntrustedName(f"a request of {MAX_REQUEST} characters or more: no more served")
        try:
            request = json.loads(line)
        except ValueError:
            raise UntrustedName("a request that is not JSON") from None
        if request == {"teardown": True}:
            return {"steps": teardown()}, "teardown"
        if not isinstance(request, dict) or set(request) != {"setup"}:
            raise UntrustedName("neither a set-up nor a teardown")
        asked = checked_setup(request["setup"], zones)
    except UntrustedName as error:
        print(f"resolver helper: refused: {error}", file=sys.stderr, flush=True)
        return {"error": f"the privileged helper refused the request: {error}"}, None
    try:
        plan = setup(method=asked.method, names=asked.names, domains=asked.domains,
                     server=asked.server)  # fmt: skip
    except (ResolverError, UntrustedName, OSError, RuntimeError) as error:
        return {"error": str(error)}, None
    return {"method": plan.method, "steps": plan.steps, "notes": plan.notes}, "setup"
