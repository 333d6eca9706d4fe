"""Who listens on a loopback port: the kernel's answer, so a job cannot serve another's.

A job declares its endpoint's port (``--iso-metrics``), but any process on the node may bind
a free port first. Before reading a job's endpoint the agent asks the kernel which uid owns
the listening sockets that *receive* a connection to 127.0.0.1:PORT (``/proc/net/tcp`` and
``tcp6``); only the job's own user's listener is read. So a job (or anyone) squatting another
user's port makes that job's latency unknown, never a figure of its choosing.

Which listeners receive it is the kernel's bind rules, since ``/proc`` does not show
``IPV6_V6ONLY``: an IPv4 socket on 127.0.0.1 or 0.0.0.0 (or an IPv6 one bound to the mapped
``::ffff:127.0.0.1`` / ``::ffff:0.0.0.0``) takes it, the specific address before the wildcard;
a dual-stack ``[::]`` socket takes it only when no such IPv4 socket exists, because a
dual-stack bind conflicts with every IPv4 bind of the port (only the same uid may share one,
with ``SO_REUSEPORT``). So when an IPv4 listener is there, every ``[::]`` one beside it is
IPv6-only and can never receive the agent's connection: another user's IPv6-only socket on a
job's port spoils nothing. ``[::1]`` never receives an IPv4 connection.

The kernel lists listening sockets first, so reading stops at the first socket in another
state: a node with 100,000 connections costs no more than one with none. Every listening
socket is read, however many: a user who opens 70,000 of them must not push a job's
listener out of the agent's view (the table holds at most 65,536 ports either way).
"""

from __future__ import annotations

from typing import Dict, Optional, Set

_LISTEN = "0A"

#: Where a listener is bound, as far as a connection to 127.0.0.1 is concerned, by the
#: kernel's order of preference: (file, address as /proc/net writes it) -> rank.
_EXACT, _ANY4, _ANY6 = 0, 1, 2
_RANK = {
    ("tcp", "0100007F"): _EXACT,
    ("tcp", "00000000"): _ANY4,
    ("tcp6", "0000000000000000FFFF00000100007F"): _EXACT,
    ("tcp6", "0000000000000000FFFF000000000000"): _ANY4,
    ("tcp6", "0" * 32): _ANY6,
}


def _read(proc: str) -> Optional[Dict[int, Dict[int, Set[int]]]]:
    """port -> rank -> uids of the listeners that could take 127.0.0.1:port; None if
    neither file could be read."""
    out: Dict[int, Dict[int, Set[int]]] = {}
    read_any = False
    for name in ("tcp", "tcp6"):
        try:
            with open(f"{proc}/net/{name}", encoding="ascii", errors="replace") as fh:
                read_any = True
                next(fh, None)  # header
                for line in fh:
                    parts = line.split()
                    if len(parts) < 8 or parts[3] != _LISTEN:
                        break
                    addr, _, port = parts[1].partition(":")
                    rank = _RANK.get((name, addr.upper()))
                    if rank is None or not parts[7].isdigit():
                        continue
                    try:
                        number = int(port, 16)
                    except ValueError:
                        continue
                    out.setdefault(number, {}).setdefault(rank, set()).add(int(parts[7]))
        except OSError:
            continue
    return out if read_any else None


def loopback_listeners(proc: str = "/proc") -> Optional[Dict[int, Set[int]]]:
    """port -> uids of the listening sockets a connection to 127.0.0.1:port reaches (the
    kernel's first choice: an exact 127.0.0.1 bind, else an IPv4 wildcard, else a dual-stack
    ``[::]``); None if /proc/net is unreadable."""
    ranked = _read(proc)
    if ranked is None:
        return None
    return {port: ranks[min(ranks)] for port, ranks in ranked.items()}
