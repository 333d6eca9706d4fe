"""Who listens on a loopback port: the kernel's answer, so a job cannot serve another's.

A job declares its endpoint's port (``--iso-metrics``), but any process on the node may bind
a free port first. Before reading a job's endpoint the agent asks the kernel which uid owns
the listening sockets 127.0.0.1:PORT reaches (``/proc/net/tcp`` and ``tcp6``: 127.0.0.1,
0.0.0.0, ``::`` and ``::ffff:127.0.0.1``); only the job's own user's listener is read. So a
job (or anyone) squatting another user's port makes that job's latency unknown, never a
figure of its choosing.

The kernel lists listening sockets first, so reading stops at the first socket in another
state: a node with 100,000 connections costs no more than one with none.
"""

from __future__ import annotations

from typing import Dict, Optional, Set

_LISTEN = "0A"
#: Local addresses a connection to 127.0.0.1 can reach (hex, as /proc/net writes them).
_V4 = {"0100007F", "00000000"}
_V6 = {"0" * 32, "0000000000000000FFFF00000100007F"}
MAX_LISTENERS = 65536


def loopback_listeners(proc: str = "/proc") -> Optional[Dict[int, Set[int]]]:
    """port -> uids of the listening sockets 127.0.0.1:port reaches; None if unreadable."""
    out: Dict[int, Set[int]] = {}
    read_any = False
    for name, addrs in (("tcp", _V4), ("tcp6", _V6)):
        try:
            with open(f"{proc}/net/{name}", encoding="ascii", errors="replace") as fh:
                read_any = True
                next(fh, None)  # header
                for n, line in enumerate(fh):
                    parts = line.split()
                    if n >= MAX_LISTENERS or len(parts) < 8 or parts[3] != _LISTEN:
                        break
                    addr, _, port = parts[1].partition(":")
                    if addr.upper() in addrs and parts[7].isdigit():
                        try:
                            out.setdefault(int(port, 16), set()).add(int(parts[7]))
                        except ValueError:
                            continue
        except OSError:
            continue
    return out if read_any else None
