"""One line of what a node rung (host limit, park) did: for the agent's log and the node's
journal, with the note behind it, ``by: node``, as the monitor's own restraint lines read."""

from __future__ import annotations

import logging
from typing import Any, List, Optional

from slurmiso.restraints import Note

log = logging.getLogger(__name__)


def say(lines: List[str], journal: Any, node: str, event: str, job: str, now: float,
        ok: bool, why: str, note: Optional[Note] = None, **details: Any) -> None:
    """Append the line to ``lines`` and, where there is a journal, the event to it."""
    lines.append(f"job {job}: {event}: {why}" if job else f"{event}: {why}")
    if journal is None:
        return
    from slurmiso.state.journal import MONITOR_SOURCE

    details.update({"by": "node", "node": node, "ts": now})
    if note is not None:
        details.update(cause=note.cause, gpu=f"{note.node}/{note.gpu}",
                       bound={"max_s": note.max_s, "on_bound": note.on_bound.value},
                       restraint=note.to_dict())
    try:
        journal.append(event, source=MONITOR_SOURCE, target=job, reason=why, ok=ok,
                       dry_run=False, details=details)
    except OSError as exc:
        log.warning("%s: cannot write the journal: %s", event, exc)
