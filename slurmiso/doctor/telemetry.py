"""What the monitor on this host could not read (issue 32): a DCGM series that maps to no
node, a signal a server's profile cannot give. The monitor keeps last cycle's unknown signals
in its state file; ``snap["monitor"]`` holds them when doctor runs on the monitor's host."""

from __future__ import annotations

from typing import Any, Dict, List

from slurmiso.config.model import Config
from slurmiso.doctor import Check, Finding, Snapshot

#: The unknown-signal kind of series Prometheus holds that name no node of the cluster.
UNMAPPED = "prometheus/unmapped"


def check_unknown_signals(snap: Snapshot, cfg: Config) -> List[Finding]:
    mon: Dict[str, Any] = snap.get("monitor") or {}
    if mon.get("error"):
        return [Finding("warning", "monitor-state-unread",
                        f"the monitor's state {mon.get('path', '?')} could not be read "
                        f"({mon['error']})",
                        "run doctor as the monitor's user (root) on the monitor's host")]
    signals: Dict[str, int] = dict(mon.get("unknown_signals") or {})
    out: List[Finding] = []
    unmapped = int(signals.pop(UNMAPPED, 0) or 0)
    if unmapped:
        out.append(Finding(
            "warning", "telemetry-unmapped",
            f"{unmapped} DCGM series in the monitor's last cycle map to no node of the "
            f"cluster by their Hostname, hostname or instance labels: those GPUs are unknown "
            f"to the monitor (never calm)",
            "run DCGM exporter without --no-hostname, or relabel 'instance' to the node's "
            "name in Prometheus; the journal's monitor-signals line shows the labels",
            (), unmapped))
    if signals:
        words = ", ".join(f"{k} x{n}" for k, n in sorted(signals.items())[:10])
        out.append(Finding("info", "monitor-signals-unknown",
                           f"signals the monitor could not read last cycle: {words}",
                           "slurmiso monitor status shows them; slurmiso signals check URL "
                           "shows what slurmiso reads from one endpoint"))
    return out


CHECKS: List[Check] = [check_unknown_signals]
