"""How long each node's telemetry was unknown to the monitor: the report's
``telemetry_unknown`` section. Pure, from :mod:`slurmiso.audit.read.telemetry`."""

from __future__ import annotations

from typing import Any, Dict, Optional

from slurmiso.audit.figures.aggregate import Aggregator
from slurmiso.audit.read.digest import JournalDigest


def telemetry_end(agg: Aggregator, digest: JournalDigest) -> Optional[float]:
    """Where an outage still open is counted to: the window's end, else the last record."""
    if agg.until is not None:
        return agg.until
    ends = [t for t in (agg.last_time, digest.last_ts) if t is not None]
    return max(ends) if ends else None


def telemetry_section(agg: Aggregator, digest: JournalDigest) -> Dict[str, Any]:
    """Per node, the seconds its telemetry was unknown in the window (``monitor-telemetry``
    lines): status ``unknown`` with no journal at all, ``none`` with no such line (nothing
    was unknown, or a monitor older than these lines), else ``measured``."""
    log = digest.telemetry
    nodes = log.totals(telemetry_end(agg, digest))
    status = "measured" if log.lines or nodes else ("none" if digest.records else "unknown")
    return {"status": status, "nodes": nodes, "bad_lines": log.bad}
