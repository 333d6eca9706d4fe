"""Output helpers shared by subcommands: JSON for scripts, aligned text for people."""

from __future__ import annotations

import json
import os
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


def write_text(text: str, path: str, *, overwrite: bool = True) -> None:
    """Write ``text`` to ``path`` ("-" = stdout), translating OS errors once.

    A file the user may not write is not a usage error (the command line was right): it
    exits 1 with the reason and the way out, never 2 with usage text.
    """
    if path == "-":
        sys.stdout.write(text)
        return
    from slurmiso.errors import SlurmisoError, UsageError

    if not overwrite and os.path.exists(path):
        raise UsageError(f"{path} exists; not overwriting it",
                         hint="pass --force to replace it, or -o another path")
    try:
        with open(path, "w", encoding="utf-8") as fh:
            fh.write(text)
    except PermissionError as exc:
        raise SlurmisoError(f"cannot write {path}: {exc.strerror}",
                            hint="run as root (sudo), or write elsewhere with -o") from None
    except OSError as exc:
        raise SlurmisoError(f"cannot write {path}: {exc.strerror}") from None
