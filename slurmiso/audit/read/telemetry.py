"""How long each node's telemetry was unknown, from the monitor's ``monitor-telemetry``
lines (written when a node's telemetry turns unknown and when it is back: docs/journal.md),
folded by :class:`~slurmiso.audit.read.digest.JournalDigest` in time order.

The lines are the monitor's (root; the digest checked the writer), yet a journal is a file
others can damage: a line whose node, state or duration is not one is counted as bad and
left out. Clipped to the window: an outage begun before it counts from its start (the
``unknown_s`` of the line that ends it, or a line before the window), one still open at its
end counts up to the end and says so.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any, Dict, Optional, Tuple

#: Longer than any outage a year of journal holds: a larger duration is not a real one.
MAX_UNKNOWN_S = 400 * 86400.0
_MAX_NAME = 100


@dataclass
class TelemetryLog:
    """Per node: the unknown seconds inside the window, and the outage still open."""

    lines: int = 0
    bad: int = 0
    seconds: Dict[str, float] = field(default_factory=dict)
    reasons: Dict[str, str] = field(default_factory=dict)
    #: node -> (when its open outage began, clipped to the window; why)
    open: Dict[str, Tuple[float, str]] = field(default_factory=dict)

    def add(self, rec: Dict[str, Any], when: float, since: Optional[float]) -> None:
        """Fold one ``monitor-telemetry`` line in (one before the window opens an outage
        that may reach into it, and counts nothing by itself)."""
        checked = _check(rec)
        inside = since is None or when >= since
        if checked is None:
            if inside:
                self.bad += 1
            return
        node, state, reason, unknown_s = checked
        if inside:
            self.lines += 1
        start = when if since is None else max(when, since)
        if state == "unknown":
            self.open.setdefault(node, (start, reason))
            return
        began = self.open.pop(node, None)
        if not inside:
            return
        if began is not None:
            spent = when - began[0]
        elif unknown_s is not None:  # the outage began before anything read here
            spent = unknown_s if since is None else min(unknown_s, when - since)
        else:
            return
        self._count(node, max(0.0, spent), reason)

    def _count(self, node: str, seconds: float, reason: str) -> None:
        self.seconds[node] = self.seconds.get(node, 0.0) + seconds
        if reason:
            self.reasons[node] = reason

    def totals(self, end: Optional[float]) -> Dict[str, Dict[str, Any]]:
        """node -> {"unknown_s", "still_unknown", "reason"}, outages still open counted up
        to ``end`` (the window's end, or the last record read)."""
        out: Dict[str, Dict[str, Any]] = {}
        for node in sorted(set(self.seconds) | set(self.open)):
            secs = self.seconds.get(node, 0.0)
            began = self.open.get(node)
            if began is not None and end is not None:
                secs += max(0.0, end - began[0])
            out[node] = {"unknown_s": round(secs, 1), "still_unknown": began is not None,
                         "reason": (began[1] if began else "") or self.reasons.get(node, "")}
        return out


def _check(rec: Dict[str, Any]) -> Optional[Tuple[str, str, str, Optional[float]]]:
    """(node, state, reason, unknown_s) of a good line, None of a bad one."""
    node, state, reason = rec.get("node"), rec.get("state"), rec.get("reason", "")
    if not isinstance(node, str) or not node or len(node) > _MAX_NAME \
            or not node.isprintable():
        return None
    if state not in ("unknown", "known"):
        return None
    if not isinstance(reason, str) or len(reason) > _MAX_NAME or not reason.isprintable():
        return None
    value = rec.get("unknown_s")
    unknown_s: Optional[float] = None
    if value is not None:
        if isinstance(value, bool) or not isinstance(value, (int, float)) \
                or not math.isfinite(value) or not 0 <= value <= MAX_UNKNOWN_S:
            return None
        unknown_s = float(value)
    return node, str(state), reason, unknown_s
