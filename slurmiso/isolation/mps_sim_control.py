"""The MPS stand-in's control logic, without sockets: defaults, servers, limits, commands.

:mod:`slurmiso.isolation.mps_sim` runs it behind a unix socket. Kept apart so the rules a
client is held to (the server's limits, narrowed but never raised by its variables) read in
one place and can be tested without a daemon.
"""

from __future__ import annotations

import json
import logging
import re
from dataclasses import dataclass, field
from typing import Dict, List, Optional

from slurmiso.isolation.mps_sim_partitions import SmPartitions, refusal
from slurmiso.pids import pid_alive

_MEM_RE = re.compile(r"([0-9]{1,9})\s*(M|MB|G|GB)", re.IGNORECASE)
_FIRST_SERVER_PID = 100000

log = logging.getLogger("slurmiso.mps_sim")


# -- limits -----------------------------------------------------------------------------------


def parse_mem(text: str) -> Optional[int]:
    """MiB from an MPS memory value (``512M``, ``30G``, ``1024MB``); None when malformed."""
    m = _MEM_RE.fullmatch(text.strip())
    if not m:
        return None
    value = int(m.group(1))
    return value * 1024 if m.group(2).upper().startswith("G") else value


def parse_client_mem(text: str) -> Dict[int, int]:
    """``CUDA_MPS_PINNED_DEVICE_MEM_LIMIT`` (``0=1G,1=512M``) as {device: MiB}; bad items drop."""
    limits: Dict[int, int] = {}
    for item in text.split(","):
        dev, sep, value = item.partition("=")
        mb = parse_mem(value) if sep else None
        if dev.strip().isdigit() and mb is not None and len(dev.strip()) < 4:
            limits[int(dev)] = mb
    return limits


def parse_percentage(text: str) -> Optional[float]:
    """A thread percentage in (0, 100]; None when malformed or out of range."""
    try:
        value = float(text)
    except ValueError:
        return None
    return value if 0 < value <= 100 else None


@dataclass
class Server:
    """A simulated ``nvidia-cuda-mps-server``: its uid and the limits it was started with."""

    pid: int
    uid: int
    thread_percentage: float
    mem_limits_mb: Dict[int, int]
    clients: List[int] = field(default_factory=list)

    def grant(self, client_thread: str, client_mem: str, devices: int = 1) -> Dict[str, object]:
        """What a client gets: the server's limits, narrowed (never raised) by its variables.

        Only the daemon's ``devices`` exist for the client (ordinals 0..devices-1).
        """
        thread = self.thread_percentage
        wanted = parse_percentage(client_thread) if client_thread else None
        if wanted is not None:
            thread = min(thread, wanted)
        mem = dict(self.mem_limits_mb)
        for dev, mb in parse_client_mem(client_mem).items():
            if dev < devices:
                mem[dev] = min(mem[dev], mb) if dev in mem else mb
        return {
            "mps": True, "server_pid": self.pid, "uid": self.uid,
            "active_thread_percentage": thread,
            "pinned_device_mem_limit_mb": {str(d): mb for d, mb in sorted(mem.items())},
        }


class Controller:
    """The control daemon's bookkeeping, without sockets: defaults, servers, commands."""

    def __init__(self, devices: int = 1, partitions: Optional[SmPartitions] = None) -> None:
        self.devices = devices  # the GPUs in the daemon's CUDA_VISIBLE_DEVICES
        #: Static SM partitions (``-S``): every client must name one.
        self.partitions = partitions
        self.default_thread_percentage = 100.0
        self.default_mem_mb: Dict[int, int] = {}
        self.servers: List[Server] = []
        self.quitting = False

    def _server(self, word: str) -> Optional[Server]:
        return next((s for s in self.servers if word.isdigit() and s.pid == int(word)), None)

    def start_server(self, uid: int) -> Server:
        """The uid's server, started with the current defaults if it has none."""
        for server in self.servers:
            if server.uid == uid:
                return server
        pid = _FIRST_SERVER_PID + len(self.servers)
        server = Server(pid, uid, self.default_thread_percentage, dict(self.default_mem_mb))
        self.servers.append(server)
        log.info("started server %d for uid %d (threads %g%%, pinned %s)",
                 pid, uid, server.thread_percentage, server.mem_limits_mb)
        return server

    def connect_client(self, uid: int, pid: int, words: List[str]) -> str:
        """A client's connection: what libcuda would learn from the daemon and server."""
        env = dict(w.split("=", 1) for w in words if "=" in w)
        for server in self.servers:  # a client that exited no longer holds its server
            server.clients = [c for c in server.clients if pid_alive(c)]
        foreign = [s for s in self.servers if s.uid != uid and s.clients]
        if foreign:  # NVIDIA: queued until the other user's server has no clients
            return json.dumps({"mps": True, "queued_behind_uid": foreign[0].uid}) + "\n"
        self.servers = [s for s in self.servers if s.uid == uid]
        part: Dict[str, object] = {}
        if self.partitions is not None:
            got, why = self.partitions.grant(env.get("part", ""))
            if got is None:
                return refusal(why)
            part = got
        server = self.start_server(uid)
        server.clients.append(pid)
        granted = server.grant(env.get("thread", ""), env.get("mem", ""), self.devices)
        granted.update(part)  # a partition's SMs, not the thread percentage, bound it
        return json.dumps(granted) + "\n"

    def command(self, line: str) -> str:
        """Answer one control command line as NVIDIA's control shell would (roughly)."""
        words = line.split()
        if self.partitions is not None:
            answer = self.partitions.command(words)
            if answer is not None:
                return answer
        name, args = (words[0], words[1:]) if words else ("", [])
        if name == "quit" and not args:
            self.quitting = True
            return ""
        if name == "get_server_list" and not args:
            return "".join(f"{s.pid}\n" for s in self.servers)
        if name == "start_server" and len(args) == 2 and args[0] == "-uid" and args[1].isdigit():
            self.start_server(int(args[1]))
            return ""
        if name == "set_default_active_thread_percentage" and len(args) == 1:
            value = parse_percentage(args[0])
            if value is not None:
                self.default_thread_percentage = value
                return f"{value:.1f}\n"
        if name == "get_default_active_thread_percentage" and not args:
            return f"{self.default_thread_percentage:.1f}\n"
        if name == "set_default_device_pinned_mem_limit" and len(args) == 2 and args[0].isdigit():
            mb = parse_mem(args[1])
            if mb is not None and int(args[0]) < self.devices:
                self.default_mem_mb[int(args[0])] = mb
                return ""
        if name == "get_default_device_pinned_mem_limit" and len(args) == 1 and args[0].isdigit():
            mb = self.default_mem_mb.get(int(args[0]))
            return f"{mb}M\n" if mb is not None else "none\n"
        server = self._server(args[0]) if args else None
        if server is not None:
            if name == "get_client_list" and len(args) == 1:
                server.clients = [c for c in server.clients if pid_alive(c)]
                return "".join(f"{c}\n" for c in server.clients)
            if name == "set_active_thread_percentage" and len(args) == 2:
                value = parse_percentage(args[1])
                if value is not None:
                    server.thread_percentage = value
                    return f"{value:.1f}\n"
            if name == "get_active_thread_percentage" and len(args) == 1:
                return f"{server.thread_percentage:.1f}\n"
            if name == "set_device_pinned_mem_limit" and len(args) == 3 and args[1].isdigit():
                mb = parse_mem(args[2])
                if mb is not None:
                    server.mem_limits_mb[int(args[1])] = mb
                    return ""
            if name == "get_device_pinned_mem_limit" and len(args) == 2 and args[1].isdigit():
                mb = server.mem_limits_mb.get(int(args[1]))
                return f"{mb}M\n" if mb is not None else "none\n"
        return f"error: invalid command: {line[:200]}\n"
