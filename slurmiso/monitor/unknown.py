"""Unknown telemetry, counted in one place (pure).

A node whose agent stops answering is unknown data, never calm: admission keeps training
off it and the ladder neither steps nor releases there. That must also be *loud*, and say
the same thing wherever an operator looks. So :func:`track` (called by
:func:`~slurmiso.monitor.decide.decide`) keeps, in the monitor's memory, every pool node
whose telemetry is unknown (since when, why) and the unknown signals of the last cycle;
``monitor status`` (text and ``--json``) and the exported metrics both read them through
:func:`view`, and the loop logs a WARNING and journals a ``monitor-telemetry`` line when a
node turns unknown and when it comes back (:func:`changes`), which the audit reads back
as the time each node was unknown.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Dict, List, Optional

from slurmiso.monitor.policy import Memory, Policy
from slurmiso.monitor.snapshot import Snapshot

#: The journal event of a node's telemetry turning unknown, and coming back.
EVENT = "monitor-telemetry"
#: Journaled when the kinds of unknown signals change (a Prometheus series mapping to no
#: node, a profile with no error counter): which kinds, how many, the first lines why.
SIGNALS_EVENT = "monitor-signals"
UNKNOWN, KNOWN = "unknown", "known"
#: A node with no age and no reason from the source (no answer at all), one too old.
NO_DATA, STALE = "telemetry/no-data", "telemetry/stale"


def track(snap: Snapshot, policy: Policy, mem: Memory) -> None:
    """Note which pool nodes' telemetry is unknown now (kept since when it first was) and
    this cycle's unknown signals. Nodes Slurm does not schedule on (down, drained) and
    nodes of no pool are not the monitor's to watch."""
    now = snap.ts
    old = mem.telemetry_unknown
    out: Dict[str, Dict[str, Any]] = {}
    for node in snap.nodes:
        if not node.pool or not node.usable:
            continue
        age = node.telemetry_age_s
        if age is not None and age <= policy.max_data_age_s:
            continue
        reason = snap.telemetry_unknown.get(node.name) or (NO_DATA if age is None else STALE)
        before = old.get(node.name) or {}
        since = _number(before.get("since"))
        out[node.name] = {"since": now if since is None else since, "reason": reason}
    if out != old:
        mem.telemetry_unknown = out
    signals = {str(k): int(v) for k, v in snap.unknown.items() if v}
    if signals != mem.unknown_signals:
        mem.unknown_signals = signals


def view(mem: Memory, now: float) -> Dict[str, Any]:
    """What is unknown now, as status and metrics show it: ``nodes`` (node -> since, for how
    long, why), ``signals`` (source/reason -> count last cycle) and ``scopes`` (admission's
    scopes with unknown data, since when)."""
    nodes = {}
    for name, rec in sorted(mem.telemetry_unknown.items()):
        since = _number(rec.get("since")) if isinstance(rec, dict) else None
        reason = str(rec.get("reason", "")) if isinstance(rec, dict) else ""
        nodes[name] = {"since": since, "for_s": None if since is None else
                       round(max(0.0, now - since), 1), "reason": reason}
    return {"nodes": nodes, "signals": dict(sorted(mem.unknown_signals.items())),
            "scopes": dict(sorted(mem.unknown_since.items()))}


@dataclass(frozen=True)
class Change:
    """One node's telemetry turning unknown, or known again after ``unknown_s``."""

    node: str
    state: str
    reason: str
    since: Optional[float]
    unknown_s: Optional[float] = None

    def journal_fields(self) -> Dict[str, Any]:
        out: Dict[str, Any] = {"node": self.node, "state": self.state, "reason": self.reason,
                               "since": self.since}
        if self.unknown_s is not None:
            out["unknown_s"] = self.unknown_s
        return out


def changes(before: Memory, after: Memory, now: float) -> List[Change]:
    """The nodes whose telemetry turned unknown, or known again, between two memories."""
    out: List[Change] = []
    was, now_unknown = before.telemetry_unknown, after.telemetry_unknown
    for name in sorted(set(now_unknown) - set(was)):
        rec = now_unknown[name]
        out.append(Change(name, UNKNOWN, str(rec.get("reason", "")),
                          _number(rec.get("since"))))
    for name in sorted(set(was) - set(now_unknown)):
        rec = was[name] if isinstance(was[name], dict) else {}
        since = _number(rec.get("since"))
        out.append(Change(name, KNOWN, str(rec.get("reason", "")), since,
                          None if since is None else round(max(0.0, now - since), 1)))
    return out


def _number(value: Any) -> Optional[float]:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    return float(value) if math.isfinite(value) else None
