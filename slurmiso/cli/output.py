"""Output helpers shared by subcommands: JSON for scripts, aligned text for people."""

from __future__ import annotations

import json
import sys
from typing import Any, List, Optional, Sequence, TextIO


def print_json(data: Any, stream: Optional[TextIO] = None) -> None:
    stream = stream or sys.stdout  # looked up per call: tests and pipes swap sys.stdout
    json.dump(data, stream, indent=2, sort_keys=True, default=str)
    stream.write("\n")


def table(rows: Sequence[Sequence[Any]], header: Sequence[str]) -> str:
    """Plain aligned table (no dependencies, copy-paste friendly)."""
    cells: List[List[str]] = [[str(h) for h in header]] + [[str(c) for c in r] for r in rows]
    widths = [max(len(r[i]) for r in cells) for i in range(len(header))]
    lines = ["  ".join(c.ljust(w) for c, w in zip(r, widths)).rstrip() for r in cells]
    return "\n".join(lines)
