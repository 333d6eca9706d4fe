"""The MPS stand-in's protocol 3 ("MPS v3"), without sockets: named servers, namespaces per
server, their limits and priorities, and what a client routed to one is granted.

    >>> c = V3Controller(devices=1)
    >>> c.command(["server", "create", "shared", "--uid=0"], caller_uid=0)
    (0, '')
    >>> c.command(["namespace", "create", "train", "--server=shared"], caller_uid=0)
    (0, '')

Modelled as NVIDIA's MPS guide documents it (releases 615 and latest: "MPS v3 Interface",
"MPS v3 Namespaces", the environment appendix; docs/mps-v3.md), issue 35 item 7:

* ``nvidia-cuda-mps-control <module> <verb> [positional] [--key=value]``, for the modules
  ``server`` (create, delete, list, set, get) and ``namespace`` (create, delete, list, set,
  get) and ``client list``; names are lower-case letters, digits and underscores, at most
  64; ``server set`` writes the server's ``default`` namespace;
* a namespace holds a pinned-memory limit (``4G``, ``512M``), an active thread percentage
  (1-100) and a client priority (0 normal, 1 below normal);
* a client routed to a namespace (by the socket it connects to,
  ``<pipe>/<server>/<namespace>/control``; ``<pipe>/<server>/control`` is ``default``; the
  top-level socket routes by uid to ``uid_<uid>``) gets the namespace's thread percentage
  whatever its own ``CUDA_MPS_ACTIVE_THREAD_PERCENTAGE`` says, the lower of the namespace's
  and its own ``CUDA_MPS_PINNED_DEVICE_MEM_LIMIT``, and its own ``CUDA_MPS_CLIENT_PRIORITY``
  where it sets one (the namespace's is only the default);
* multi-user mode (``-m``): only ``--uid=0`` servers, whose clients may be any user's;
  otherwise a server takes only its own uid's clients.

NVIDIA documents no error text or exit codes for the verbs: the stand-in answers exit 1 and
one ``error: ...`` line. Whether ``set`` reaches clients already connected is not documented
either: here a grant is computed once, at connection, as v2's variables are.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any, Dict, List, Optional, Tuple, Union

from slurmiso.isolation.mps_sim_control import parse_client_mem, parse_mem, parse_percentage

NAME_RE = re.compile(r"[a-z0-9_]{1,64}")
DEFAULT_NAMESPACE = "default"
PRIORITIES = (0, 1)  # normal, below normal
Answer = Tuple[int, str]


@dataclass
class Namespace:
    """A namespace's limits; None: not set."""

    name: str
    memory_limit_mb: Optional[int] = None
    thread_percentage: Optional[float] = None
    priority: Optional[int] = None


@dataclass
class V3Server:
    name: str
    uid: int
    namespaces: Dict[str, Namespace] = field(default_factory=dict)
    clients: List[Tuple[int, str]] = field(default_factory=list)  # (pid, namespace)

    def __post_init__(self) -> None:
        self.namespaces.setdefault(DEFAULT_NAMESPACE, Namespace(DEFAULT_NAMESPACE))


def _error(text: str) -> Answer:
    return 1, f"error: {text}\n"


def _split(args: List[str]) -> Tuple[List[str], Dict[str, str]]:
    """(positional, options) of a verb's arguments: ``--key=value``, ``key=value`` or a
    valueless ``--flag`` (value "")."""
    pos: List[str] = []
    opts: Dict[str, str] = {}
    for arg in args:
        if arg.startswith("--"):
            key, _, value = arg[2:].partition("=")
            opts[key] = value
        elif "=" in arg:
            key, _, value = arg.partition("=")
            opts[key] = value
        else:
            pos.append(arg)
    return pos, opts


class V3Controller:
    """A protocol-3 control daemon's bookkeeping: servers, namespaces, clients."""

    def __init__(self, devices: int = 1, multiuser: bool = False) -> None:
        self.devices = devices
        self.multiuser = multiuser
        self.servers: Dict[str, V3Server] = {}

    # -- commands --------------------------------------------------------------------------
    def command(self, argv: List[str], caller_uid: int) -> Answer:
        """Answer one ``<module> <verb> ...`` as the control binary would (exit, output)."""
        if len(argv) < 2:
            return _error("usage: <module> <verb> [args]")
        module, verb, rest = argv[0], argv[1], argv[2:]
        pos, opts = _split(rest)
        handler = getattr(self, f"_{module}_{verb}".replace("-", "_"), None)
        if module not in ("server", "namespace", "client") or handler is None:
            return _error(f"unknown command {module} {verb}")
        answer: Answer = handler(pos, opts, caller_uid)
        return answer

    def _server_create(self, pos: List[str], opts: Dict[str, str], caller: int) -> Answer:
        uid_text = opts.get("uid")
        if uid_text is not None and not uid_text.isdigit():
            return _error(f"--uid={uid_text}: not a uid")
        uid = int(uid_text) if uid_text is not None else caller
        if self.multiuser and uid != 0:
            return _error("in multiuser mode only --uid=0 is allowed")
        if uid != caller and caller != 0:
            return _error(f"uid {caller} may not create a server for uid {uid}")
        name = pos[0] if pos else (f"uid_{uid}" if uid_text is not None else "")
        if not NAME_RE.fullmatch(name):
            return _error(f"server name {name!r}: lower-case letters, digits and "
                          "underscores, at most 64")
        if name in self.servers:
            return _error(f"server {name} exists")
        self.servers[name] = V3Server(name, uid)
        return 0, ""

    def _server_delete(self, pos: List[str], opts: Dict[str, str], caller: int) -> Answer:
        server = self._own_server(pos[0] if pos else "", caller)
        if isinstance(server, tuple):
            return server
        if server.clients and "force" not in opts:
            return _error(f"server {server.name} has active clients (use --force)")
        del self.servers[server.name]
        return 0, ""

    def _server_list(self, pos: List[str], opts: Dict[str, str], caller: int) -> Answer:
        header = "name,uid,pid,status,pipe-directory,allowed-devices,context-ids"
        rows = [f"{s.name},{s.uid},-,Ready,-,-,-" for s in self.servers.values()
                if not pos or s.name == pos[0]]
        return 0, _listing(header, rows, opts.get("format", "csv"))

    def _server_set(self, pos: List[str], opts: Dict[str, str], caller: int) -> Answer:
        return self._namespace_set([DEFAULT_NAMESPACE],
                                   dict(opts, server=pos[0] if pos else ""), caller)

    def _server_get(self, pos: List[str], opts: Dict[str, str], caller: int) -> Answer:
        if len(pos) != 2 or pos[0] not in self.servers:
            return _error("usage: server get <name> <field>")
        server = self.servers[pos[0]]
        values = {"name": server.name, "uid": str(server.uid), "status": "Ready"}
        if pos[1] not in values:
            return _error(f"unknown field {pos[1]}")
        return 0, values[pos[1]] + "\n"

    def _namespace_create(self, pos: List[str], opts: Dict[str, str], caller: int) -> Answer:
        server = self._own_server(opts.get("server", ""), caller)
        if isinstance(server, tuple):
            return server
        name = pos[0] if pos else ""
        if not NAME_RE.fullmatch(name):
            return _error(f"namespace name {name!r}: lower-case letters, digits and "
                          "underscores, at most 64")
        if name in server.namespaces:
            return _error(f"namespace {name} exists on server {server.name}")
        server.namespaces[name] = Namespace(name)
        return 0, ""

    def _namespace_delete(self, pos: List[str], opts: Dict[str, str], caller: int) -> Answer:
        server = self._own_server(opts.get("server", ""), caller)
        if isinstance(server, tuple):
            return server
        name = pos[0] if pos else ""
        if name == DEFAULT_NAMESPACE or name not in server.namespaces:
            return _error(f"no namespace {name!r} to delete on server {server.name}")
        if any(ns == name for _, ns in server.clients) and "force" not in opts:
            return _error(f"namespace {name} has active clients (use --force)")
        del server.namespaces[name]
        return 0, ""

    def _namespace_set(self, pos: List[str], opts: Dict[str, str], caller: int) -> Answer:
        server = self._own_server(opts.get("server", ""), caller)
        if isinstance(server, tuple):
            return server
        ns = server.namespaces.get(pos[0] if pos else "")
        if ns is None:
            return _error(f"no namespace {pos[:1]} on server {server.name}")
        changes = {k: v for k, v in opts.items() if k != "server"}
        if not changes:
            return _error("at least one option is required")
        for key, value in changes.items():
            problem = _apply(ns, key, value)
            if problem:
                return _error(problem)
        return 0, ""

    def _namespace_get(self, pos: List[str], opts: Dict[str, str], caller: int) -> Answer:
        if len(pos) != 3 or pos[1] not in self.servers:
            return _error("usage: namespace get <name> <server> <field>")
        ns = self.servers[pos[1]].namespaces.get(pos[0])
        if ns is None:
            return _error(f"no namespace {pos[0]} on server {pos[1]}")
        values = {
            "name": ns.name, "server": pos[1], "server-status": "Ready",
            "pinned-memory-limit": "-" if ns.memory_limit_mb is None
            else f"{ns.memory_limit_mb}M",
            "active-thread-percentage": "-" if ns.thread_percentage is None
            else f"{ns.thread_percentage:g}",
            "client-priority": "-" if ns.priority is None else str(ns.priority),
        }
        if pos[2] not in values:
            return _error(f"unknown field {pos[2]}")
        return 0, values[pos[2]] + "\n"

    def _namespace_list(self, pos: List[str], opts: Dict[str, str], caller: int) -> Answer:
        header = ("name,server,server-status,pinned-memory-limit,active-thread-percentage,"
                  "client-priority,pipe-directory")
        rows = []
        for server in self.servers.values():
            if opts.get("server") and server.name != opts["server"]:
                continue
            for ns in server.namespaces.values():
                if pos and ns.name != pos[0]:
                    continue
                rows.append(",".join([
                    ns.name, server.name, "Ready",
                    "-" if ns.memory_limit_mb is None else f"{ns.memory_limit_mb}M",
                    "-" if ns.thread_percentage is None else f"{ns.thread_percentage:g}",
                    "-" if ns.priority is None else str(ns.priority), "-"]))
        return 0, _listing(header, rows, opts.get("format", "csv"))

    def _client_list(self, pos: List[str], opts: Dict[str, str], caller: int) -> Answer:
        rows = [f"{pid},{s.name},0,{ns},-" for s in self.servers.values()
                for pid, ns in s.clients
                if not opts.get("server") or s.name == opts["server"]]
        return 0, _listing("pid,server,device,namespace,cmd", rows, opts.get("format", "csv"))

    def _own_server(self, name: str, caller: int) -> Union[V3Server, Answer]:
        """The server named, where ``caller`` may change it; else an error answer."""
        server = self.servers.get(name)
        if server is None:
            return _error(f"no server {name!r}")
        if caller not in (0, server.uid):
            return _error(f"server {name} belongs to uid {server.uid}")
        return server

    # -- clients ---------------------------------------------------------------------------
    def connect(self, uid: int, pid: int, route: Tuple[str, str],
                env: Dict[str, str]) -> Dict[str, object]:
        """What a client of ``uid`` connecting through ``route`` ((server, namespace); ("", "")
        for the top-level socket) is granted, or ``{"error": ...}``."""
        server_name, ns_name = route
        if not server_name:
            server_name, ns_name = (self._uid_route(uid), DEFAULT_NAMESPACE)
        server = self.servers.get(server_name)
        if server is None:
            return {"mps": False, "error": f"no server {server_name!r}"}
        if server.uid != uid and not (self.multiuser and server.uid == 0):
            return {"mps": False, "error": f"server {server.name} serves uid {server.uid}"}
        ns = server.namespaces.get(ns_name or DEFAULT_NAMESPACE)
        if ns is None:
            return {"mps": False, "error": f"no namespace {ns_name!r} on {server.name}"}
        server.clients.append((pid, ns.name))
        return {"mps": True, "protocol": 3, "server": server.name, "namespace": ns.name,
                "uid": uid, **grant(ns, env, self.devices)}

    def _uid_route(self, uid: int) -> str:
        """The top-level socket's uid routing (615): the uid's own server, made on demand."""
        name = f"uid_{uid}"
        if self.multiuser:
            name = next((s.name for s in self.servers.values() if s.uid == 0), name)
        if name not in self.servers:
            self.servers[name] = V3Server(name, 0 if self.multiuser else uid)
        return name


def grant(ns: Namespace, env: Dict[str, str], devices: int = 1) -> Dict[str, object]:
    """A client's limits in ``ns`` with its own variables, as NVIDIA's appendix combines
    them: the namespace's thread percentage overrides the client's; the pinned-memory limit
    is the lower of the two; the client's priority, where it sets a valid one, wins."""
    thread = ns.thread_percentage
    if thread is None:
        thread = parse_percentage(env.get("CUDA_MPS_ACTIVE_THREAD_PERCENTAGE", "")) or 100.0
    limits: Dict[int, int] = {}
    if ns.memory_limit_mb is not None:
        limits = {dev: ns.memory_limit_mb for dev in range(devices)}
    for dev, mb in parse_client_mem(env.get("CUDA_MPS_PINNED_DEVICE_MEM_LIMIT", "")).items():
        if dev < devices:
            limits[dev] = min(limits.get(dev, mb), mb)
    own = env.get("CUDA_MPS_CLIENT_PRIORITY", "").strip()
    priority = int(own) if own in ("0", "1") else (ns.priority or 0)
    return {"active_thread_percentage": thread, "client_priority": priority,
            "priority_from": "client" if own in ("0", "1") else "namespace",
            "pinned_device_mem_limit_mb": {str(d): mb for d, mb in sorted(limits.items())}}


def _apply(ns: Namespace, key: str, value: str) -> str:
    """Set one of a namespace's limits from ``--key=value``; the problem, or ""."""
    if key == "active-thread-percentage":
        pct = parse_percentage(value)
        if pct is None or pct != int(pct):
            return f"--active-thread-percentage={value}: a whole percentage 1-100"
        ns.thread_percentage = pct
    elif key == "pinned-memory-limit":
        mb = parse_mem(value)
        if mb is None:
            return f"--pinned-memory-limit={value}: a size such as 4G or 512M"
        ns.memory_limit_mb = mb
    elif key == "client-priority":
        if value not in ("0", "1"):
            return f"--client-priority={value}: 0 (normal) or 1 (below normal)"
        ns.priority = int(value)
    else:
        return f"unknown option --{key}"
    return ""


def _listing(header: str, rows: List[str], fmt: str) -> str:
    """A list verb's output in ``csv`` or ``csv,noheader`` (the sim's table is csv too)."""
    lines = rows if "noheader" in fmt else [header, *rows]
    return "".join(line + "\n" for line in lines)


# -- the configuration file (``-a FILE``) ----------------------------------------------------

#: What NVIDIA's "MPS v3 Configuration File" lets a server and a namespace hold ("any other
#: key is a configuration error"). Device and SM-partition tables are not modelled here.
SERVER_KEYS = frozenset({"allowed_devices", "pinned_memory_limit", "active_thread_percentage",
                         "client_priority", "uid", "locality_domains", "namespaces"})
LIMIT_KEYS = {"pinned_memory_limit": "pinned-memory-limit",
              "active_thread_percentage": "active-thread-percentage",
              "client_priority": "client-priority"}


def apply_config(controller: V3Controller, text: str) -> None:
    """Apply a TOML configuration once, as the daemon does at start (``-a``): its servers,
    their default namespace's limits and their namespaces. ValueError names the first
    problem; nothing is applied then."""
    try:
        import tomllib  # type: ignore[import-not-found,unused-ignore]  # Python 3.11+
    except ImportError as exc:  # pragma: no cover - 3.9/3.10
        raise ValueError("the stand-in reads MPS v3 configuration files on Python 3.11+ "
                         "(tomllib)") from exc
    try:
        data = tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise ValueError(f"not TOML: {exc}") from None
    unknown = set(data) - {"schema_version", "servers"}
    if unknown or str(data.get("schema_version", "")) != "1.0":
        raise ValueError(f"configuration error: schema_version must be \"1.0\"; unknown "
                         f"top-level key(s) {sorted(unknown)}")
    staged = V3Controller(controller.devices, controller.multiuser)
    for name, server in (data.get("servers") or {}).items():
        _configure_server(staged, name, server)
    controller.servers.update(staged.servers)


def _configure_server(staged: V3Controller, name: str, server: Any) -> None:
    if not isinstance(server, dict):
        raise ValueError(f"configuration error in servers.{name}: not a table")
    if set(server) - SERVER_KEYS:
        raise ValueError(f"configuration error in servers.{name}: unknown key(s) "
                         f"{sorted(set(server) - SERVER_KEYS)}")
    uid = str(server.get("uid", 0))
    _must(staged.command(["server", "create", name, f"--uid={uid}"], 0), f"servers.{name}")
    _set_limits(staged, DEFAULT_NAMESPACE, name, server, f"servers.{name}")
    for ns, limits in (server.get("namespaces") or {}).items():
        where = f"servers.{name}.namespaces.{ns}"
        if not isinstance(limits, dict) or set(limits) - set(LIMIT_KEYS):
            raise ValueError(f"configuration error in {where}: a namespace holds only "
                             f"{', '.join(LIMIT_KEYS)}")
        if ns != DEFAULT_NAMESPACE:
            _must(staged.command(["namespace", "create", ns, f"--server={name}"], 0), where)
        _set_limits(staged, ns, name, limits, where)


def _set_limits(staged: V3Controller, ns: str, server: str, table: Dict[str, Any],
                where: str) -> None:
    opts = [f"--{flag}={table[key]}" for key, flag in LIMIT_KEYS.items() if key in table]
    if opts:
        _must(staged.command(["namespace", "set", ns, f"--server={server}", *opts], 0), where)


def _must(answer: Answer, where: str) -> None:
    if answer[0] != 0:
        raise ValueError(f"configuration error in {where}: {answer[1].strip()}")

