"""A node rung's write-ahead record on disk: one versioned JSON file in root's state dir.

The host rung (``host-limits.json``) and the park rung (``parks.json``) each keep what they
applied and the notes they will not act on again ("done"); both read the file bounded and
distrustfully (never raising: what is not whole is a problem line), write it atomically, and
move a file that is not whole aside for a human.
"""

from __future__ import annotations

import json
import os
from typing import Any, Callable, Dict, List, Optional, Tuple, TypeVar

T = TypeVar("T")
#: Larger than any real record (a few entries per job on a node); a bigger file is not ours.
MAX_BYTES = 1 << 20


def read(path: str, version: int, entries_key: str,
         problems: List[str]) -> Tuple[List[Any], List[Any]]:
    """(entries, done entries) of the record at ``path``, both lists; empty when there is no
    file. What is unreadable or not a ``version`` record is a line of ``problems``."""
    name = os.path.basename(path)
    try:
        with open(path, "rb") as f:
            raw = f.read(MAX_BYTES + 1)
        if len(raw) > MAX_BYTES:
            raise ValueError(f"over {MAX_BYTES} bytes")
        data = json.loads(raw.decode("utf-8"))
    except FileNotFoundError:
        return [], []
    except (OSError, ValueError, RecursionError) as exc:
        problems.append(f"{name} unreadable: {exc}")
        return [], []
    if not isinstance(data, dict) or data.get("version") != version:
        problems.append(f"{name}: not a version {version} record")
        return [], []
    entries, done = data.get(entries_key), data.get("done", [])
    if not isinstance(entries, list) or not isinstance(done, list):
        problems.append(f"{name}: {entries_key} or done is not a list")
        return (entries if isinstance(entries, list) else []), []
    return entries, done


def parse_each(items: List[Any], parse: Callable[[Any], T], what: str,
               problems: List[str]) -> List[T]:
    """Each item parsed; one that is not whole is a line of ``problems`` and left out."""
    out: List[T] = []
    for i, item in enumerate(items):
        try:
            out.append(parse(item))
        except (KeyError, TypeError, ValueError, OverflowError) as exc:
            problems.append(f"{what}[{i}]: {exc}")
    return out


def write(path: str, version: int, entries_key: str, entries: List[Dict[str, Any]],
          done: List[Dict[str, Any]]) -> None:
    """Replace the record atomically (root's file, readable by ``slurmiso status``)."""
    from slurmiso.atomic import write_atomic

    os.makedirs(os.path.dirname(path), exist_ok=True)
    data = {"version": version, entries_key: entries, "done": done}
    write_atomic(path, json.dumps(data, sort_keys=True) + "\n", mode=0o644)


def quarantine(path: str, now: float) -> Optional[str]:
    """Move a record that is not whole aside (``<name>.bad-<ts>``); where it went, or None."""
    from slurmiso.atomic import move_aside

    target = f"{path}.bad-{int(now)}"
    try:
        move_aside(path, target)
    except OSError:
        return None
    return target
