"""Node-level host figures: pressure stall information and NIC byte counters.

    >>> read_node_pressure("tests/fixtures/host/proc").cpu.some.avg10
    41.2

Network has no per-cgroup counter: neither cgroup v1 nor v2 accounts bytes sent or received
per cgroup (net_cls/net_prio only tag packets), so network contention can be seen per node,
never attributed to a job. ``proc_root`` is a parameter so tests read recorded trees.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Dict, Iterable, Optional

from slurmiso.host.cgroup_figures import PressureFigures
from slurmiso.host.kernel_text import Psi, parse_psi, parse_single, parse_uint, read_text


def read_node_pressure(proc_root: str = "/proc") -> PressureFigures:
    """``/proc/pressure/{cpu,memory,io}``; None per resource where PSI is off or absent."""
    def one(name: str) -> Optional[Psi]:
        return parse_psi(read_text(os.path.join(proc_root, "pressure", name)))

    return PressureFigures(cpu=one("cpu"), memory=one("memory"), io=one("io"))


@dataclass(frozen=True)
class NicCounters:
    """Cumulative bytes one interface received and sent since it came up."""

    rx_bytes: int
    tx_bytes: int


def parse_net_dev(text: str) -> Dict[str, NicCounters]:
    """Interfaces from /proc/net/dev text; a malformed line drops that interface only.

    After two header lines each line is ``name: rx_bytes packets errs drop fifo frame
    compressed multicast tx_bytes ...`` (16 numbers); rx bytes are field 0, tx bytes field 8.
    """
    out: Dict[str, NicCounters] = {}
    for line in text.splitlines()[2:]:
        name, sep, rest = line.partition(":")
        fields = rest.split()
        if not sep or len(fields) < 16 or not name.strip():
            continue
        rx, tx = parse_uint(fields[0]), parse_uint(fields[8])
        if rx is not None and tx is not None:
            out[name.strip()] = NicCounters(rx_bytes=rx, tx_bytes=tx)
    return out


def read_net_dev(proc_root: str = "/proc") -> Dict[str, NicCounters]:
    """The node's NIC counters; empty when /proc/net/dev cannot be read."""
    text = read_text(os.path.join(proc_root, "net", "dev"))
    return {} if text is None else parse_net_dev(text)


def read_link_speeds(sys_root: str = "/sys",
                     names: Iterable[str] = ()) -> Dict[str, Optional[float]]:
    """Link speed in bytes/s per interface from ``class/net/<name>/speed`` (Mbit/s).

    None where the kernel does not know it: the file is absent, unreadable (EINVAL while the
    link is down) or reads -1, as virtual interfaces do.
    """
    out: Dict[str, Optional[float]] = {}
    for name in names:
        if "/" in name or name in (".", ".."):
            continue
        mbits = parse_single(read_text(os.path.join(sys_root, "class", "net", name, "speed")))
        out[name] = None if not mbits else mbits * 1_000_000 / 8
    return out
