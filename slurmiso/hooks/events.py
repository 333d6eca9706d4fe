"""The job's own events file: created by the prolog for the job's user, folded by the epilog.

The wrapper (``slurmiso run``) runs as the job's user and cannot write root's journal, so the
prolog creates ``<state_dir>/events/<jobid>.jsonl`` owned by the job's uid (in a root-owned
directory, opened without following links) and exports ``SLURMISO_EVENTS_FILE``. The epilog
copies its lines into the node journal tagged ``"source": "job"`` — the user wrote them, so
they are the job's report, never evidence for anything privileged — and removes the file.
"""

from __future__ import annotations

import json
import logging
import os
from typing import Any, Dict, List

log = logging.getLogger(__name__)

MAX_BYTES = 4 * 1024 * 1024  # a job's events are a few KiB; never let one flood the journal
_FLAGS = os.O_NOFOLLOW | getattr(os, "O_CLOEXEC", 0)


def events_path(state_dir: str, job_id: str) -> str:
    return os.path.join(state_dir, "events", f"{job_id}.jsonl")


def create(state_dir: str, job_id: str, uid: int) -> str:
    """Create (or keep) the job's events file owned by ``uid``; return its path."""
    folder = os.path.join(state_dir, "events")
    os.makedirs(folder, 0o755, exist_ok=True)
    path = events_path(state_dir, job_id)
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | _FLAGS, 0o600)
    except FileExistsError:  # a requeued job keeps appending to the same file
        return path
    try:
        if uid >= 0 and os.geteuid() == 0:
            os.fchown(fd, uid, -1)
    finally:
        os.close(fd)
    return path


def fold(state_dir: str, job_id: str) -> List[Dict[str, Any]]:
    """Read and remove the job's events; return the parsed records (garbage lines skipped)."""
    path = events_path(state_dir, job_id)
    try:
        fd = os.open(path, os.O_RDONLY | _FLAGS)
    except FileNotFoundError:
        return []
    except OSError as exc:  # e.g. ELOOP: someone replaced it with a link
        log.warning("ignoring job events file %s: %s", path, exc)
        _unlink(path)
        return []
    try:
        raw = os.read(fd, MAX_BYTES)
    finally:
        os.close(fd)
    _unlink(path)
    out = []
    for line in raw.splitlines():
        try:
            rec = json.loads(line)
        except ValueError:
            continue
        if isinstance(rec, dict) and isinstance(rec.get("event"), str):
            out.append(rec)
    return out


def _unlink(path: str) -> None:
    try:
        os.unlink(path)
    except FileNotFoundError:
        pass
